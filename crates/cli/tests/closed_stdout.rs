//! A closed stdout (`ext4kit mkfs ... | true`, `ext4kit info IMG | head -1`)
//! never panics and never leaves a format half-done: the work finishes,
//! nothing is printed on stderr, and the exit status is 141 (128 + SIGPIPE)
//! as a shell shows for coreutils in the same spot.

mod common;

use std::process::Stdio;

use common::*;

/// Run `cmd` with a stdout pipe whose reader is already gone.
fn run_closed(mut cmd: std::process::Command) -> std::process::Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    cmd.stdout(Stdio::from(writer)).stderr(Stdio::piped());
    cmd.output().expect("run ext4kit")
}

#[test]
fn mkfs_and_info_finish_with_closed_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("new.img");
    let cmd = ext4kit_mkfs([img.to_str().unwrap(), "64M"]);
    let out = run_closed(cmd);
    assert_eq!(out.status.code(), Some(141), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if have("e2fsck") {
        e2fsck_clean(&img).unwrap();
    }
    let mut cmd = ext4kit();
    cmd.arg("info").arg(&img);
    let out = run_closed(cmd);
    assert_eq!(out.status.code(), Some(141), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
