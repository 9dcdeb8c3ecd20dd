//! Directory loops in damaged images (issue 24): a directory entry that
//! points back at the directory itself or an ancestor (`debugfs -w -R
//! 'link <13> /d1/sub/self'`). `rm -r` refuses before writing (one line
//! naming the path, exit 1, the image byte for byte as it was, no
//! needs_recovery); `cp -r`/`cp -a` out of the image copy everything but
//! the loop (one line naming it, exit 1); `ls -R` refuses to list it
//! again. A deep healthy tree is still removed (no recursion).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

/// The inode number of `path` in `img` (`ext4kit stat --json`).
fn ino(img: &Path, path: &str) -> u32 {
    let out = run_ok(ext4kit().arg("stat").arg("--json").arg(at(img, path))).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["inode"].as_u64().unwrap() as u32
}

fn at(img: &Path, path: &str) -> String {
    format!("{}:{path}", img.display())
}

fn debugfs_w(img: &Path, req: &str) {
    run_ok(tool("debugfs").arg("-w").arg("-R").arg(req).arg(img)).unwrap();
}

/// /d1/sub/f, /d1/sub/deeper/g, /d1/other/h and /top, then `links`
/// (name in the image, path whose inode it names) added by debugfs.
fn looped(dir: &Path, name: &str, links: &[(&str, &str)]) -> PathBuf {
    let img = mkimg(dir, name, "8M", &["-b", "1024"]);
    let host = dir.join(format!("{name}.src"));
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("f"), b"file f\n").unwrap();
    run_ok(
        ext4kit()
            .arg("mkdir")
            .arg("-p")
            .args([at(&img, "/d1/sub/deeper"), at(&img, "/d1/other")]),
    )
    .unwrap();
    for p in ["/d1/sub/f", "/d1/sub/deeper/g", "/d1/other/h", "/top"] {
        run_ok(ext4kit().arg("cp").arg(host.join("f")).arg(at(&img, p))).unwrap();
    }
    for (link, target) in links {
        let n = ino(&img, target);
        debugfs_w(&img, &format!("link <{n}> {link}"));
    }
    img
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 1 and exactly one stderr line, containing every `want`.
fn one_line_failure(o: &Output, want: &[&str]) -> Result<(), String> {
    let e = stderr(o);
    if o.status.code() != Some(1) {
        return Err(format!("exit status {} (want 1): {e}", o.status));
    }
    if e.lines().count() != 1 || want.iter().any(|w| !e.contains(w)) {
        return Err(format!("want one line with {want:?}, got: {e}"));
    }
    Ok(())
}

/// e2fsck -fn's complaints (its output without the version and summary
/// lines, which name counts).
fn e2fsck_text(img: &Path) -> String {
    let out = run(tool("e2fsck").arg("-fn").arg(img)).unwrap();
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    s.lines()
        .filter(|l| !l.starts_with("e2fsck ") && !l.contains(" files ("))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn rm_r_refuses_a_loop_and_writes_nothing() {
    if let Err(why) = e2fs_tools() {
        return skip("rm_r_refuses_a_loop_and_writes_nothing", &why);
    }
    let dir = image_dir();
    let mut failures = Vec::new();
    for (label, links, names) in [
        ("self", &[("/d1/sub/self", "/d1/sub")][..], "/d1/sub/self"),
        (
            "ancestor",
            &[("/d1/sub/deeper/up", "/d1")][..],
            "/d1/sub/deeper/up",
        ),
        (
            "linked twice",
            &[("/d1/sub/again", "/d1/other")][..],
            "/d1/other",
        ),
    ] {
        let img = looped(
            dir.path(),
            &format!("rm-{}.img", label.replace(' ', "-")),
            links,
        );
        let before = std::fs::read(&img).unwrap();
        let fsck_before = e2fsck_text(&img);
        let res = (|| {
            let o = run(ext4kit().arg("rm").arg("-r").arg(at(&img, "/d1")))?;
            one_line_failure(&o, &[names])?;
            if std::fs::read(&img).unwrap() != before {
                return Err("the image changed".into());
            }
            if dumpe2fs_h(&img).contains("needs_recovery") {
                return Err("needs_recovery left set".into());
            }
            if e2fsck_text(&img) != fsck_before {
                return Err("e2fsck reports something new".into());
            }
            // What has no loop is still removed, and adds no damage.
            run_ok(ext4kit().arg("rm").arg(at(&img, "/top")))?;
            if e2fsck_text(&img) != fsck_before {
                return Err("e2fsck reports something new after rm /top".into());
            }
            Ok(())
        })();
        report_case(label, res, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every path below `root` (relative), sorted.
fn host_tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.symlink_metadata().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn cp_out_of_an_image_skips_a_loop() {
    if let Err(why) = e2fs_tools() {
        return skip("cp_out_of_an_image_skips_a_loop", &why);
    }
    let dir = image_dir();
    let img = looped(
        dir.path(),
        "cp.img",
        &[("/d1/sub/self", "/d1/sub"), ("/d1/sub/deeper/up", "/d1")],
    );
    let mut failures = Vec::new();
    for (label, args, src, base) in [
        ("cp -r IMG:/d1", &["-r"][..], "/d1", "d1/"),
        ("cp -a IMG:/", &["-a"][..], "/", ""),
    ] {
        let out = dir.path().join(format!("out{}", args[0]));
        std::fs::create_dir(&out).unwrap();
        let res = (|| {
            let o = run(ext4kit().arg("cp").args(args).arg(at(&img, src)).arg(&out))?;
            let e = stderr(&o);
            if o.status.code() != Some(1)
                || e.lines().count() != 2
                || !e.contains("/d1/sub/self': not copying a directory loop")
                || !e.contains("/d1/sub/deeper/up': not copying a directory loop")
            {
                return Err(format!("status {}, stderr {e}", o.status));
            }
            let root = if src == "/" {
                out.clone()
            } else {
                out.join("d1")
            };
            let got = host_tree(&root);
            let mut want: Vec<String> = [
                "other",
                "other/h",
                "sub",
                "sub/deeper",
                "sub/deeper/g",
                "sub/f",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if src == "/" {
                want = want.iter().map(|w| format!("d1/{w}")).collect();
                want.extend(["d1".to_string(), "lost+found".into(), "top".into()]);
                want.sort();
            }
            if got != want {
                return Err(format!("copied {got:?}, want {want:?} ({base})"));
            }
            Ok(())
        })();
        report_case(label, res, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn ls_r_refuses_a_loop() {
    if let Err(why) = e2fs_tools() {
        return skip("ls_r_refuses_a_loop", &why);
    }
    let dir = image_dir();
    let img = looped(dir.path(), "ls.img", &[("/d1/sub/self", "/d1/sub")]);
    let o = run(ext4kit().arg("ls").arg("-R").arg(at(&img, "/d1"))).unwrap();
    one_line_failure(
        &o,
        &["/d1/sub/self': not listing already-listed directory (a loop)"],
    )
    .unwrap();
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("/d1/sub/deeper:\ng\n"), "{s}");
}

#[test]
fn rm_r_removes_a_deep_tree() {
    if let Err(why) = e2fs_tools() {
        return skip("rm_r_removes_a_deep_tree", &why);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "deep.img", "8M", &["-b", "1024"]);
    let deep = "/a".repeat(400);
    run_ok(ext4kit().arg("mkdir").arg("-p").arg(at(&img, &deep))).unwrap();
    let o = run_ok(ext4kit().arg("ls").arg("-R").arg(at(&img, "/a"))).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).matches(":\n").count(),
        400
    );
    let out = dir.path().join("out");
    run_ok(ext4kit().arg("cp").arg("-r").arg(at(&img, "/a")).arg(&out)).unwrap();
    assert_eq!(host_tree(&out).len(), 399);
    run_ok(ext4kit().arg("rm").arg("-r").arg(at(&img, "/a"))).unwrap();
    let s = e2fsck_clean(&img).unwrap();
    assert_eq!(used_inodes(&s), Some(11), "{s}");
}

#[test]
fn cp_out_never_leaves_the_destination() {
    if let Err(why) = e2fs_tools() {
        return skip("cp_out_never_leaves_the_destination", &why);
    }
    let dir = image_dir();
    // No metadata_csum: the changed name is read as it is.
    let img = mkimg(
        dir.path(),
        "name.img",
        "8M",
        &["-b", "1024", "-O", "^metadata_csum"],
    );
    let host = dir.path().join("f");
    std::fs::write(&host, b"x").unwrap();
    run_ok(ext4kit().arg("cp").arg(&host).arg(at(&img, "/zq9"))).unwrap();
    // The root directory's block: "zq9" becomes "/q9".
    let out = run_ok(tool("debugfs").arg("-R").arg("blocks /").arg(&img)).unwrap();
    let blk: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let mut bytes = std::fs::read(&img).unwrap();
    let b = &mut bytes[blk as usize * 1024..(blk as usize + 1) * 1024];
    let at_name = b.windows(3).position(|w| w == b"zq9").unwrap();
    b[at_name] = b'/';
    std::fs::write(&img, &bytes).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = run(ext4kit().arg("cp").arg("-a").arg(at(&img, "/")).arg(&out)).unwrap();
    one_line_failure(&o, &["/q9': not copying an entry with an invalid name"]).unwrap();
    assert!(!Path::new("/q9").exists());
    assert_eq!(host_tree(&out), ["lost+found"]);
}

#[test]
fn cp_out_never_writes_through_a_copied_symlink() {
    if let Err(why) = e2fs_tools() {
        return skip("cp_out_never_writes_through_a_copied_symlink", &why);
    }
    let dir = image_dir();
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let img = mkimg(
        dir.path(),
        "dup.img",
        "8M",
        &["-b", "1024", "-O", "^metadata_csum"],
    );
    let host = dir.path().join("f");
    std::fs::write(&host, b"x").unwrap();
    // /zb -> victim (a symlink), then a directory /zc holding zf.
    run_ok(
        ext4kit()
            .arg("ln")
            .arg("-s")
            .arg(&victim)
            .arg(at(&img, "/zb")),
    )
    .unwrap();
    run_ok(ext4kit().arg("mkdir").arg(at(&img, "/zc"))).unwrap();
    run_ok(ext4kit().arg("cp").arg(&host).arg(at(&img, "/zc/zf"))).unwrap();
    run_ok(ext4kit().arg("cp").arg(&host).arg(at(&img, "/zbf"))).unwrap();
    // The damage: "zc" becomes a second "zb", and the file "zbf" a
    // third ("zb" + a name_len of 2): both come after the symlink.
    let out = run_ok(tool("debugfs").arg("-R").arg("blocks /").arg(&img)).unwrap();
    let blk: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let mut bytes = std::fs::read(&img).unwrap();
    let b = &mut bytes[blk as usize * 1024..(blk as usize + 1) * 1024];
    let i = b.windows(2).position(|w| w == b"zc").unwrap();
    b[i + 1] = b'b';
    let j = b.windows(3).position(|w| w == b"zbf").unwrap();
    b[j - 2] = 2;
    std::fs::write(&img, &bytes).unwrap();
    let dst = dir.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    let _ = run(ext4kit().arg("cp").arg("-a").arg(at(&img, "/")).arg(&dst)).unwrap();
    assert_eq!(
        host_tree(&victim),
        Vec::<String>::new(),
        "wrote through the symlink"
    );
    assert!(!dst.join("zb").is_symlink());
}

/// `mv` of a directory through a second link (an entry naming a directory
/// whose '..' is elsewhere, `debugfs link`): moving it would retarget the
/// '..' of a directory that lives in another parent (issue 24, the fuzz
/// campaign's "mv dir" spreads). Refused read-only by `mv` (one line,
/// exit 1, the image as it was) and by the engine's rename (EUCLEAN, for
/// the mount); the directory moved through its own parent still moves.
#[test]
fn mv_refuses_a_directory_with_two_parents() {
    if let Err(why) = e2fs_tools() {
        return skip("mv_refuses_a_directory_with_two_parents", &why);
    }
    let dir = image_dir();
    let img = looped(dir.path(), "mv.img", &[("/alias", "/d1/sub")]);
    let before = std::fs::read(&img).unwrap();
    let fsck_before = e2fsck_text(&img);
    let o = run(ext4kit()
        .arg("mv")
        .arg(at(&img, "/alias"))
        .arg(at(&img, "/d1/other/moved")))
    .unwrap();
    one_line_failure(&o, &["/alias'", "two parents"]).unwrap();
    assert!(std::fs::read(&img).unwrap() == before, "the image changed");
    // The engine refuses too (the mount's rename), with EUCLEAN.
    let (other, alias) = (ino(&img, "/d1/other"), ino(&img, "/alias"));
    {
        let fs =
            ext4kit_fs::fs::Filesystem::open(open_file(&img), ext4kit_fs::rw::RwOptions::default())
                .unwrap();
        let flags = ext4kit_fs::fs::RenameFlags::default();
        let err = fs.rename(2, b"alias", other, b"moved", flags).unwrap_err();
        assert_eq!(err.errno(), 117, "{err}");
        assert_eq!(fs.lookup(2, b"alias").unwrap().map(|i| i.ino), Some(alias));
        fs.close().unwrap();
    }
    assert_eq!(e2fsck_text(&img), fsck_before);
    // Through its own parent it moves ('..' is right).
    run_ok(
        ext4kit()
            .arg("mv")
            .arg(at(&img, "/d1/sub"))
            .arg(at(&img, "/d1/other/moved")),
    )
    .unwrap();
    assert_eq!(ino(&img, "/d1/other/moved"), alias);
}

/// `rm -r` of a tree holding a directory whose size is 0 (its entries
/// unlisted): it would be removed as empty and its entries lost (issue
/// 24, the campaign's "rm -r" spread). Refused before writing; the
/// engine's rmdir refuses it too (EUCLEAN, as ext4_empty_dir's "invalid
/// size").
#[test]
fn rm_r_refuses_a_directory_of_size_0() {
    if let Err(why) = e2fs_tools() {
        return skip("rm_r_refuses_a_directory_of_size_0", &why);
    }
    let dir = image_dir();
    let img = looped(dir.path(), "size0.img", &[]);
    debugfs_w(&img, "set_inode_field /d1/sub size 0");
    let before = std::fs::read(&img).unwrap();
    let o = run(ext4kit().arg("rm").arg("-r").arg(at(&img, "/d1"))).unwrap();
    one_line_failure(&o, &["/d1/sub'", "no '.' entry"]).unwrap();
    assert!(std::fs::read(&img).unwrap() == before, "the image changed");
    let d1 = ino(&img, "/d1");
    let fs =
        ext4kit_fs::fs::Filesystem::open(open_file(&img), ext4kit_fs::rw::RwOptions::default())
            .unwrap();
    let err = fs.rmdir(d1, b"sub").unwrap_err();
    assert_eq!(err.errno(), 117, "{err}");
    fs.close().unwrap();
}
