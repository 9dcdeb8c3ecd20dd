//! The client against a fake in-process server on a socket pair.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::proto::*;
use super::*;

/// How the fake server behaves.
#[derive(Clone)]
struct Fake {
    size: u64,
    flags: u16,
    structured: bool,
    meta: bool,
    /// NBD_OPT_GO unknown: the client must fall back to EXPORT_NAME.
    no_go: bool,
    min_block: u32,
    max_payload: u32,
    /// Fail requests of this command (with this error value).
    fail: Option<(u16, u32)>,
    /// Close the connection when this many requests were served.
    hang_up_after: Option<usize>,
    /// Reply to every second pair of requests in reverse order.
    reorder: bool,
    /// Answer reads with hole chunks where the data is zero.
    holes: bool,
    /// An export name the server knows ("" answers any).
    export: &'static str,
    /// Hold write replies until no request came for 20 ms (so that the
    /// client's write-behind shows; other replies go at once).
    hold_writes: bool,
    /// While set, held write replies are not released even when idle
    /// (the test clears it): write-behind shown without timing.
    gate: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Answer BLOCK_STATUS with one extent only (the client asks again).
    short_status: bool,
    /// Offer NBD_OPT_EXTENDED_HEADERS (32-byte requests, every reply an
    /// extended chunk, 64-bit block status).
    extended: bool,
    /// Bytes held in memory; past them the export is a zero hole that
    /// only BLOCK_STATUS may ask about (for exports over 4 GiB).
    stored: Option<u64>,
}

impl Default for Fake {
    fn default() -> Fake {
        Fake {
            size: 1 << 20,
            flags: NBD_FLAG_HAS_FLAGS
                | NBD_FLAG_SEND_FLUSH
                | NBD_FLAG_SEND_TRIM
                | NBD_FLAG_SEND_WRITE_ZEROES,
            structured: true,
            meta: true,
            no_go: false,
            min_block: 1,
            max_payload: 1 << 16,
            fail: None,
            hang_up_after: None,
            reorder: false,
            holes: true,
            export: "",
            hold_writes: false,
            gate: None,
            short_status: false,
            extended: false,
            stored: None,
        }
    }
}

/// What the server saw.
#[derive(Default)]
struct Seen {
    cmds: Vec<(u16, u16, u64, u64)>,
    disconnected: bool,
    /// NBD_CMD_DISC seen, over all connections.
    disconnects: usize,
    /// Per request (as `cmds`): the connection it came on.
    conn_of: Vec<usize>,
    /// Write replies held, over all connections.
    held: usize,
    /// Per request: (cmd, offset, unreplied writes it overlaps, unreplied
    /// writes in all) when it arrived.
    unreplied: Vec<(u16, u64, usize, usize)>,
}

struct Server {
    data: Arc<Mutex<Vec<u8>>>,
    seen: Arc<Mutex<Seen>>,
    handle: Option<JoinHandle<()>>,
    /// The other connections' threads ([`Server::start_many`]).
    more: Vec<JoinHandle<()>>,
}

fn opt_reply(s: &mut UnixStream, opt: u32, t: u32, data: &[u8]) {
    let mut v = NBD_REP_MAGIC.to_be_bytes().to_vec();
    v.extend(opt.to_be_bytes());
    v.extend(t.to_be_bytes());
    v.extend((data.len() as u32).to_be_bytes());
    v.extend(data);
    s.write_all(&v).unwrap();
}

fn serve(mut s: UnixStream, f: Fake, data: Arc<Mutex<Vec<u8>>>, seen: Arc<Mutex<Seen>>, id: usize) {
    let _ = serve_inner(&mut s, &f, &data, &seen, id);
}

fn serve_inner(
    s: &mut UnixStream,
    f: &Fake,
    data: &Mutex<Vec<u8>>,
    seen: &Mutex<Seen>,
    id: usize,
) -> std::io::Result<()> {
    s.write_all(&NBDMAGIC.to_be_bytes())?;
    s.write_all(&IHAVEOPT.to_be_bytes())?;
    s.write_all(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes())?;
    let cflags = read_u32(s)?;
    assert_eq!(cflags, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    let mut structured = false;
    let mut extended = false;
    loop {
        assert_eq!(read_u64(s)?, IHAVEOPT);
        let opt = read_u32(s)?;
        let len = read_u32(s)?;
        let mut d = vec![0u8; len as usize];
        s.read_exact(&mut d)?;
        match opt {
            NBD_OPT_EXTENDED_HEADERS if f.extended => {
                (structured, extended) = (true, true);
                opt_reply(s, opt, NBD_REP_ACK, &[]);
            }
            NBD_OPT_STRUCTURED_REPLY if f.structured => {
                structured = true;
                opt_reply(s, opt, NBD_REP_ACK, &[]);
            }
            NBD_OPT_SET_META_CONTEXT if f.meta && structured => {
                let mut ctx = 7u32.to_be_bytes().to_vec();
                ctx.extend(BASE_ALLOCATION.as_bytes());
                opt_reply(s, opt, NBD_REP_META_CONTEXT, &ctx);
                opt_reply(s, opt, NBD_REP_ACK, &[]);
            }
            NBD_OPT_GO if !f.no_go => {
                let nlen = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
                let name = std::str::from_utf8(&d[4..4 + nlen]).unwrap();
                if !f.export.is_empty() && name != f.export {
                    opt_reply(s, opt, NBD_REP_ERR_UNKNOWN, b"no such export");
                    continue;
                }
                let mut e = NBD_INFO_EXPORT.to_be_bytes().to_vec();
                e.extend(f.size.to_be_bytes());
                e.extend(f.flags.to_be_bytes());
                opt_reply(s, opt, NBD_REP_INFO, &e);
                let mut b = NBD_INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                b.extend(f.min_block.to_be_bytes());
                b.extend(4096u32.to_be_bytes());
                b.extend(f.max_payload.to_be_bytes());
                opt_reply(s, opt, NBD_REP_INFO, &b);
                opt_reply(s, opt, NBD_REP_ACK, &[]);
                break;
            }
            NBD_OPT_EXPORT_NAME => {
                s.write_all(&f.size.to_be_bytes())?;
                s.write_all(&f.flags.to_be_bytes())?;
                break;
            }
            _ => opt_reply(s, opt, NBD_REP_ERR_UNSUP, &[]),
        }
    }
    let mut served = 0usize;
    let mut held: Vec<Vec<u8>> = Vec::new();
    // Held write replies: (offset, len, reply).
    let mut held_w: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let hsize = if extended {
        Request::EXTENDED_SIZE
    } else {
        Request::SIZE
    };
    // Replies as this connection must send them.
    let chunk = |flags: u16, t: u16, cookie: u64, offset: u64, p: &[u8]| {
        if extended {
            encode_ext_chunk(flags, t, cookie, offset, p)
        } else {
            encode_chunk(flags, t, cookie, p)
        }
    };
    let simple = |error: u32, cookie: u64, offset: u64| {
        if !extended {
            encode_simple_reply(error, cookie)
        } else if error == 0 {
            encode_ext_chunk(
                NBD_REPLY_FLAG_DONE,
                NBD_REPLY_TYPE_NONE,
                cookie,
                offset,
                &[],
            )
        } else {
            let mut p = error.to_be_bytes().to_vec();
            p.extend(0u16.to_be_bytes());
            encode_ext_chunk(
                NBD_REPLY_FLAG_DONE,
                NBD_REPLY_TYPE_ERROR,
                cookie,
                offset,
                &p,
            )
        }
    };
    loop {
        let mut h = vec![0u8; hsize];
        if f.hold_writes {
            // The first byte with a timeout: when none comes, the held
            // replies go out.
            s.set_read_timeout(Some(Duration::from_millis(20)))?;
            loop {
                match s.read(&mut h[..1]) {
                    Ok(0) => return Ok(()),
                    Ok(_) => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        let closed = f
                            .gate
                            .as_ref()
                            .is_some_and(|g| g.load(std::sync::atomic::Ordering::SeqCst));
                        if !closed {
                            seen.lock().unwrap().held -= held_w.len();
                            for (_, _, r) in held_w.drain(..) {
                                s.write_all(&r)?;
                            }
                        }
                    }
                    Err(_) => return Ok(()),
                }
            }
            s.set_read_timeout(None)?;
            if s.read_exact(&mut h[1..]).is_err() {
                return Ok(());
            }
        } else if s.read_exact(&mut h).is_err() {
            return Ok(());
        }
        let r = Request::decode(&h)?;
        {
            let mut sn = seen.lock().unwrap();
            sn.cmds.push((r.cmd, r.flags, r.offset, r.len));
            sn.conn_of.push(id);
            let end = r.offset + r.len.max(1);
            let over = held_w
                .iter()
                .filter(|(o, l, _)| *o < end && r.offset < o + *l)
                .count();
            let all = sn.held;
            sn.unreplied.push((r.cmd, r.offset, over, all));
        }
        if r.cmd == NBD_CMD_DISC {
            let mut sn = seen.lock().unwrap();
            sn.disconnected = true;
            sn.disconnects += 1;
            return Ok(());
        }
        let mut payload = vec![
            0u8;
            if r.cmd == NBD_CMD_WRITE {
                r.len as usize
            } else {
                0
            }
        ];
        s.read_exact(&mut payload)?;
        if f.hang_up_after == Some(served) {
            return Ok(());
        }
        served += 1;
        let (o, l) = (r.offset as usize, r.len as usize);
        let reply = if let Some(e) = f.fail.filter(|(c, _)| *c == r.cmd).map(|(_, e)| e) {
            if structured {
                let mut p = e.to_be_bytes().to_vec();
                p.extend(5u16.to_be_bytes());
                p.extend(b"nope!");
                chunk(
                    NBD_REPLY_FLAG_DONE,
                    NBD_REPLY_TYPE_ERROR,
                    r.cookie,
                    r.offset,
                    &p,
                )
            } else {
                encode_simple_reply(e, r.cookie)
            }
        } else {
            let mut d = data.lock().unwrap();
            match r.cmd {
                NBD_CMD_READ if structured => {
                    let mut v = Vec::new();
                    // Two chunks: a hole for a zero first half, data.
                    let half = l / 2;
                    if f.holes && half > 0 && d[o..o + half].iter().all(|&b| b == 0) {
                        let mut p = r.offset.to_be_bytes().to_vec();
                        p.extend((half as u32).to_be_bytes());
                        v.extend(chunk(0, NBD_REPLY_TYPE_OFFSET_HOLE, r.cookie, r.offset, &p));
                        let mut p = (r.offset + half as u64).to_be_bytes().to_vec();
                        p.extend(&d[o + half..o + l]);
                        v.extend(chunk(
                            NBD_REPLY_FLAG_DONE,
                            NBD_REPLY_TYPE_OFFSET_DATA,
                            r.cookie,
                            r.offset,
                            &p,
                        ));
                    } else {
                        let mut p = r.offset.to_be_bytes().to_vec();
                        p.extend(&d[o..o + l]);
                        v.extend(chunk(
                            NBD_REPLY_FLAG_DONE,
                            NBD_REPLY_TYPE_OFFSET_DATA,
                            r.cookie,
                            r.offset,
                            &p,
                        ));
                    }
                    v
                }
                NBD_CMD_READ => {
                    let mut v = encode_simple_reply(0, r.cookie);
                    v.extend(&d[o..o + l]);
                    v
                }
                NBD_CMD_WRITE => {
                    d[o..o + l].copy_from_slice(&payload);
                    simple(0, r.cookie, r.offset)
                }
                NBD_CMD_WRITE_ZEROES | NBD_CMD_TRIM => {
                    let e = (o + l).min(d.len());
                    d[o.min(e)..e].fill(0);
                    simple(0, r.cookie, r.offset)
                }
                NBD_CMD_FLUSH => simple(0, r.cookie, r.offset),
                NBD_CMD_BLOCK_STATUS => {
                    // 4 KiB granules, the last one may go past the request;
                    // past the stored bytes one hole to the request's end.
                    let mut descs: Vec<(u64, u32)> = Vec::new();
                    let mut at = o - o % 4096;
                    let first = at;
                    while at < o + l {
                        if at >= d.len() {
                            let n = (o + l - at.max(o)) as u64;
                            let n = if extended { n } else { n.min(0xFFFF_F000) };
                            descs.push((n, NBD_STATE_ZERO | NBD_STATE_HOLE));
                            break;
                        }
                        let z = d[at..(at + 4096).min(d.len())].iter().all(|&b| b == 0);
                        let st = if z {
                            NBD_STATE_ZERO | NBD_STATE_HOLE
                        } else {
                            0
                        };
                        let len = if at == first {
                            4096 - (o - first)
                        } else {
                            4096
                        };
                        descs.push((len as u64, st));
                        at += 4096;
                        if f.short_status {
                            break;
                        }
                    }
                    let mut p = 7u32.to_be_bytes().to_vec();
                    if extended {
                        p.extend((descs.len() as u32).to_be_bytes());
                        for (n, st) in descs {
                            p.extend(n.to_be_bytes());
                            p.extend(u64::from(st).to_be_bytes());
                        }
                    } else {
                        for (n, st) in descs {
                            p.extend((n as u32).to_be_bytes());
                            p.extend(st.to_be_bytes());
                        }
                    }
                    let t = if extended {
                        NBD_REPLY_TYPE_BLOCK_STATUS_EXT
                    } else {
                        NBD_REPLY_TYPE_BLOCK_STATUS
                    };
                    chunk(NBD_REPLY_FLAG_DONE, t, r.cookie, r.offset, &p)
                }
                _ => simple(NBD_EINVAL, r.cookie, r.offset),
            }
        };
        if f.hold_writes && r.cmd == NBD_CMD_WRITE {
            seen.lock().unwrap().held += 1;
            held_w.push((r.offset, r.len, reply));
        } else if f.reorder {
            held.push(reply);
            if held.len() == 2 {
                for r in held.drain(..).rev() {
                    s.write_all(&r)?;
                }
            }
            // A lone request at the end must be answered too: the
            // client sends at most WINDOW, so flush when nothing follows
            // within the pair (tests use even counts).
        } else {
            s.write_all(&reply)?;
        }
    }
}

impl Server {
    fn start(f: Fake) -> (Server, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let data = Arc::new(Mutex::new(vec![0u8; f.stored.unwrap_or(f.size) as usize]));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (d, s) = (Arc::clone(&data), Arc::clone(&seen));
        let handle = std::thread::spawn(move || serve(b, f, d, s, 0));
        (
            Server {
                data,
                seen,
                handle: Some(handle),
                more: Vec::new(),
            },
            a,
        )
    }
    /// `n` connections to one export (shared data and record).
    fn start_many(f: Fake, n: usize) -> (Server, Vec<UnixStream>) {
        let (mut srv, first) = Server::start(f.clone());
        let mut socks = vec![first];
        for id in 1..n {
            let (a, b) = UnixStream::pair().unwrap();
            let (d, s, f) = (Arc::clone(&srv.data), Arc::clone(&srv.seen), f.clone());
            srv.more
                .push(std::thread::spawn(move || serve(b, f, d, s, id)));
            socks.push(a);
        }
        (srv, socks)
    }
    fn join(&mut self) {
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
        for h in self.more.drain(..) {
            h.join().unwrap();
        }
    }
}

const T: Duration = Duration::from_secs(30);

fn connect(f: Fake) -> (Server, Result<NbdDevice>) {
    let (srv, sock) = Server::start(f);
    let dev = NbdDevice::over_unix(sock, "", OpenOptions::read_write(), T);
    (srv, dev)
}

#[test]
fn read_write_round_trip_split_and_pipelined() {
    let (mut srv, dev) = connect(Fake::default());
    let dev = dev.unwrap();
    assert_eq!(dev.size(), 1 << 20);
    assert_eq!(dev.logical_block_size(), 512);
    let buf: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    dev.write_at(&buf, 4096).unwrap();
    let mut back = vec![0u8; buf.len() + 8192];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert_eq!(&back[4096..4096 + buf.len()], &buf[..]);
    assert_eq!(&srv.data.lock().unwrap()[4096..4096 + buf.len()], &buf[..]);
    dev.flush().unwrap();
    drop(dev);
    srv.join();
    let seen = srv.seen.lock().unwrap();
    assert!(seen.disconnected, "NBD_CMD_DISC on drop");
    // 300000 bytes with a 64 KiB maximum payload: 5 writes.
    let writes: Vec<_> = seen.cmds.iter().filter(|c| c.0 == NBD_CMD_WRITE).collect();
    assert_eq!(writes.len(), 5);
    assert!(writes.iter().all(|c| c.3 <= 1 << 16));
    assert!(seen.cmds.iter().any(|c| c.0 == NBD_CMD_FLUSH));
}

#[test]
fn replies_out_of_order_reach_their_callers() {
    let (_srv, dev) = connect(Fake {
        reorder: true,
        holes: false,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    // 4 writes, then 4 reads (pairs answered in reverse order).
    let buf: Vec<u8> = (0..(4u32 << 16)).map(|i| (i % 253) as u8).collect();
    dev.write_at(&buf, 0).unwrap();
    let mut back = vec![0u8; buf.len()];
    dev.read_at(&mut back, 0).unwrap();
    assert_eq!(back, buf);
}

#[test]
fn block_status_gives_known_zero_ranges() {
    let (_srv, dev) = connect(Fake::default());
    let dev = dev.unwrap();
    assert!(dev.reports_allocation());
    assert_eq!(
        dev.known_zero_ranges(0, 1 << 20).unwrap(),
        vec![(0, 1 << 20)]
    );
    dev.write_at(&[1u8; 10], 8192 + 100).unwrap();
    assert_eq!(
        dev.known_zero_ranges(1000, 20000).unwrap(),
        vec![(1000, 8192), (12288, 21000)]
    );
    assert!(dev.is_known_zero(0, 8192).unwrap());
    // The known-zero cache (from the first question) is exact to the
    // byte: the write starts at 8292.
    assert!(dev.is_known_zero(0, 8292).unwrap());
    assert!(!dev.is_known_zero(0, 8293).unwrap());
    assert_eq!(dev.allocated_bytes(), Some(4096));
    // Zeroout and discard.
    dev.zeroout(8192, 4096).unwrap();
    assert!(dev.is_known_zero(0, 1 << 20).unwrap());
    dev.write_at(&[1u8; 10], 0).unwrap();
    assert_eq!(dev.discard(0, 4096).unwrap(), DiscardOutcome::Zeroed);
    assert!(dev.discard_zeroes_data());
}

#[test]
fn short_block_status_replies_are_followed_up() {
    let (srv, dev) = connect(Fake {
        short_status: true,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    dev.write_at(&[1u8; 10], 8192 + 100).unwrap();
    assert_eq!(
        dev.known_zero_ranges(1000, 20000).unwrap(),
        vec![(1000, 8192), (12288, 21000)]
    );
    let n = srv
        .seen
        .lock()
        .unwrap()
        .cmds
        .iter()
        .filter(|c| c.0 == NBD_CMD_BLOCK_STATUS)
        .count();
    assert_eq!(n, 6, "one request per 4 KiB extent");
}

#[test]
fn discard_of_holes_sends_no_trim() {
    for short_status in [false, true] {
        let (srv, dev) = connect(Fake {
            short_status,
            ..Fake::default()
        });
        let dev = dev.unwrap();
        let trims = || {
            srv.seen
                .lock()
                .unwrap()
                .cmds
                .iter()
                .filter(|c| c.0 == NBD_CMD_TRIM)
                .count()
        };
        assert_eq!(dev.discard(0, 1 << 20).unwrap(), DiscardOutcome::Zeroed);
        assert_eq!(trims(), 0);
        dev.write_at(&[1u8; 10], 65536).unwrap();
        assert_eq!(dev.discard(0, 1 << 20).unwrap(), DiscardOutcome::Zeroed);
        assert_eq!(trims(), 1);
        assert!(srv.data.lock().unwrap().iter().all(|&b| b == 0));
    }
}

#[test]
fn hole_chunks_read_as_zeros() {
    let (_srv, dev) = connect(Fake::default());
    let dev = dev.unwrap();
    dev.write_at(&[9u8; 100], 3000).unwrap();
    let mut b = vec![0xffu8; 4096];
    dev.read_at(&mut b, 0).unwrap();
    assert!(b[..3000].iter().all(|&x| x == 0));
    assert!(b[3000..3100].iter().all(|&x| x == 9));
    assert!(b[3100..].iter().all(|&x| x == 0));
}

#[test]
fn simple_replies_and_export_name_fallback() {
    let (_srv, dev) = connect(Fake {
        structured: false,
        no_go: true,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    assert!(!dev.reports_allocation());
    assert!(!dev.discard_zeroes_data());
    assert_eq!(dev.known_zero_ranges(0, 4096).unwrap(), vec![]);
    dev.write_at(b"abc", 7).unwrap();
    let mut b = [0u8; 3];
    dev.read_at(&mut b, 7).unwrap();
    assert_eq!(&b, b"abc");
    assert_eq!(dev.discard(0, 4096).unwrap(), DiscardOutcome::Discarded);
}

#[test]
fn minimum_block_size_is_honoured() {
    let (srv, dev) = connect(Fake {
        min_block: 4096,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    assert_eq!(dev.logical_block_size(), 4096);
    dev.write_at(&[1u8; 1000], 5000).unwrap();
    let mut b = vec![0u8; 10];
    dev.read_at(&mut b, 4999).unwrap();
    assert_eq!(b, [0, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    dev.zeroout(5000, 10).unwrap();
    dev.read_at(&mut b, 4999).unwrap();
    assert_eq!(b, [0; 10]);
    let seen = srv.seen.lock().unwrap();
    for c in &seen.cmds {
        if c.0 != NBD_CMD_BLOCK_STATUS {
            assert_eq!((c.2 % 4096, c.3 % 4096), (0, 0), "{c:?}");
        }
    }
}

#[test]
fn error_replies_are_clean_errors() {
    let (_srv, dev) = connect(Fake {
        fail: Some((NBD_CMD_WRITE, NBD_ENOSPC)),
        ..Fake::default()
    });
    let dev = dev.unwrap();
    // A behind write's error: at the write or at the next call.
    let e = dev
        .write_at(&[1u8; 200_000], 0)
        .and_then(|()| dev.flush())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("test: write of "), "{e}");
    assert!(e.contains("ENOSPC") && e.contains("nope!"), "{e}");
    // It sticks (the export no longer holds what was written).
    let mut b = [0u8; 4];
    assert_eq!(dev.read_at(&mut b, 0).unwrap_err().to_string(), e);
    assert_eq!(dev.flush().unwrap_err().to_string(), e);

    // A synchronous request's error leaves the connection usable.
    let (_srv, dev) = connect(Fake {
        fail: Some((NBD_CMD_TRIM, NBD_EIO)),
        ..Fake::default()
    });
    let dev = dev.unwrap();
    // (Allocated first: a TRIM of a hole is not sent.)
    dev.write_at(&[2u8; 4096], 0).unwrap();
    let e = dev.discard(0, 4096).unwrap_err().to_string();
    assert!(e.starts_with("test: trim of ") && e.contains("EIO"), "{e}");
    dev.write_at(&[1u8; 4], 0).unwrap();
    dev.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [1u8; 4]);
    dev.flush().unwrap();

    let (_srv, dev) = connect(Fake {
        structured: false,
        fail: Some((NBD_CMD_READ, NBD_EIO)),
        ..Fake::default()
    });
    let e = dev.unwrap().read_at(&mut b, 0).unwrap_err().to_string();
    assert!(e.contains("EIO"), "{e}");
}

#[test]
fn write_zeroes_unsupported_falls_back_to_writing() {
    let (srv, dev) = connect(Fake {
        flags: NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    dev.write_at(&[5u8; 8192], 0).unwrap();
    dev.zeroout(0, 8192).unwrap();
    assert!(srv.data.lock().unwrap()[..8192].iter().all(|&b| b == 0));
    assert_eq!(dev.discard(0, 4096).unwrap(), DiscardOutcome::Unsupported);
    assert!(
        !srv.seen
            .lock()
            .unwrap()
            .cmds
            .iter()
            .any(|c| c.0 == NBD_CMD_WRITE_ZEROES || c.0 == NBD_CMD_TRIM)
    );
    // A server that says ENOTSUP to WRITE_ZEROES.
    let (srv, dev) = connect(Fake {
        fail: Some((NBD_CMD_WRITE_ZEROES, NBD_ENOTSUP)),
        ..Fake::default()
    });
    let dev = dev.unwrap();
    dev.write_at(&[5u8; 8192], 0).unwrap();
    dev.zeroout(0, 8192).unwrap();
    assert!(srv.data.lock().unwrap()[..8192].iter().all(|&b| b == 0));
}

#[test]
fn disconnect_mid_run_fails_every_request_cleanly() {
    let (_srv, dev) = connect(Fake {
        hang_up_after: Some(3),
        ..Fake::default()
    });
    let dev = dev.unwrap();
    // Behind writes: the error comes at the write or at the flush.
    let e = dev
        .write_at(&vec![1u8; 1 << 20], 0)
        .and_then(|()| dev.flush())
        .unwrap_err()
        .to_string();
    assert!(e.contains("the server closed the connection"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    // Later requests fail at once with the same reason.
    let mut b = [0u8; 4];
    let e = dev.read_at(&mut b, 0).unwrap_err().to_string();
    assert!(e.contains("the server closed the connection"), "{e}");
    assert!(dev.flush().is_err());
    assert!(dev.write_at(&[1u8; 4], 0).is_err());
}

/// The server dies with writes behind: one clear error, no hang, also at
/// drop.
#[test]
fn server_dying_with_writes_behind_fails_cleanly() {
    let (srv, dev) = connect(Fake {
        hang_up_after: Some(2),
        hold_writes: true,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    for i in 0..4u64 {
        // Small writes: all sent before any reply (write-behind), unless
        // the connection is already gone.
        if dev.write_at(&[7u8; 4096], i * 8192).is_err() {
            break;
        }
    }
    let e = dev.flush().unwrap_err().to_string();
    assert!(
        e.starts_with("test: write of 4096 bytes at byte ")
            && e.ends_with("failed: the server closed the connection"),
        "{e}"
    );
    assert_eq!(dev.flush().unwrap_err().to_string(), e);
    drop(dev);
    drop(srv);
}

/// Writes return before their replies; a read or write overlapping an
/// outstanding write waits for it; FLUSH is sent only once every earlier
/// write was acknowledged; reads see the data written.
#[test]
fn write_behind_orders_overlaps_and_flushes() {
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (mut srv, dev) = connect(Fake {
        hold_writes: true,
        gate: Some(Arc::clone(&gate)),
        ..Fake::default()
    });
    let dev = dev.unwrap();
    // Four separate calls, each one request: they return while the
    // server holds every reply (the gate is closed).
    for i in 0..4u64 {
        dev.write_at(&[i as u8 + 1; 4096], i * 65536).unwrap();
    }
    // A read elsewhere need not wait (nor send the last write, which is
    // still queued for merging: three are out).
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, 1 << 19).unwrap();
    assert_eq!(b, vec![0u8; 4096]);
    assert_eq!(srv.seen.lock().unwrap().unreplied.last().unwrap().3, 3);
    // Replies go once the server is idle; one over a written range waits.
    gate.store(false, std::sync::atomic::Ordering::SeqCst);
    dev.read_at(&mut b[..100], 65536 + 4000).unwrap();
    assert_eq!(b[..96], [2u8; 96]);
    assert_eq!(b[96..100], [0u8; 4]);
    // An overlapping write (waits for the one at 2×64 KiB).
    dev.write_at(&[9u8; 10], 2 * 65536 + 4090).unwrap();
    dev.write_at(&[5u8; 4096], 3 * 65536 + 8192).unwrap();
    dev.flush().unwrap();
    // Crash safety: everything before the acknowledged FLUSH is there.
    {
        let d = srv.data.lock().unwrap();
        assert_eq!(d[2 * 65536 + 4089..2 * 65536 + 4101], {
            let mut v = [9u8; 12];
            v[0] = 3;
            v[11] = 0;
            v
        });
        assert_eq!(d[3 * 65536 + 8192], 5);
    }
    drop(dev);
    srv.join();
    let seen = srv.seen.lock().unwrap();
    for &(cmd, off, over, all) in &seen.unreplied {
        if cmd != NBD_CMD_FLUSH && cmd != NBD_CMD_DISC {
            assert_eq!(
                over, 0,
                "cmd {cmd} at {off} sent over an unacknowledged write"
            );
        }
        if cmd == NBD_CMD_FLUSH || cmd == NBD_CMD_DISC {
            assert_eq!(all, 0, "cmd {cmd} sent before every write was acknowledged");
        }
    }
}

/// `EXT4KIT_NBD_WINDOW=1` is the one-request-at-a-time client: no write
/// is outstanding when the next request goes.
#[test]
fn window_of_one_writes_one_at_a_time() {
    let (mut srv, sock) = Server::start(Fake {
        hold_writes: true,
        ..Fake::default()
    });
    let mut dev = NbdDevice::over_unix(sock, "", OpenOptions::read_write(), T).unwrap();
    dev.window = 1;
    // Adjacent: not merged either.
    for i in 0..3u64 {
        dev.write_at(&[1u8; 4096], i * 4096).unwrap();
    }
    drop(dev);
    srv.join();
    let seen = srv.seen.lock().unwrap();
    assert!(
        seen.unreplied.iter().all(|u| u.3 == 0),
        "{:?}",
        seen.unreplied
    );
    let writes = seen.cmds.iter().filter(|c| c.0 == NBD_CMD_WRITE).count();
    assert_eq!(writes, 3);
}

/// The (offset, length) of each WRITE the server saw.
fn writes_seen(srv: &Server) -> Vec<(u64, u64)> {
    let seen = srv.seen.lock().unwrap();
    seen.cmds
        .iter()
        .filter(|c| c.0 == NBD_CMD_WRITE)
        .map(|c| (c.2, c.3))
        .collect()
}

/// Adjacent small writes go as one request, up to the bound (here the
/// server's 64 KiB maximum payload); a gap, an overlapping read and a
/// flush send what is queued first.
#[test]
fn adjacent_small_writes_are_merged() {
    let (mut srv, dev) = connect(Fake {
        hold_writes: true,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    const K4: u64 = 4096;
    for i in 0..4u64 {
        dev.write_at(&[i as u8 + 1; 4096], i * K4).unwrap();
    }
    // Nothing sent yet: queued.
    assert_eq!(writes_seen(&srv), vec![]);
    // A gap: the four go as one request; this one is queued.
    dev.write_at(&[9u8; 4096], 8 * K4).unwrap();
    dev.write_at(&[10u8; 4096], 9 * K4).unwrap();
    // A read over the queued range sends it first and sees it.
    let mut b = [0u8; 8];
    dev.read_at(&mut b, 9 * K4 - 4).unwrap();
    assert_eq!(b, [9, 9, 9, 9, 10, 10, 10, 10]);
    dev.write_at(&[11u8; 4096], 12 * K4).unwrap();
    // 20 adjacent calls: 16 fill the bound, 4 more are queued.
    for i in 0..20u64 {
        dev.write_at(&[12u8; 4096], (16 + i) * K4).unwrap();
    }
    dev.flush().unwrap();
    {
        let d = srv.data.lock().unwrap();
        assert_eq!(d[3 * 4096], 4);
        assert_eq!(d[12 * 4096], 11);
        assert!(d[16 * 4096..36 * 4096].iter().all(|&x| x == 12));
        assert!(d[36 * 4096..].iter().all(|&x| x == 0));
    }
    drop(dev);
    srv.join();
    assert_eq!(
        writes_seen(&srv),
        vec![
            (0, 16384),
            (32768, 8192),
            (49152, 4096),
            (65536, 65536),
            (131072, 16384)
        ]
    );
    let seen = srv.seen.lock().unwrap();
    // FLUSH comes after the last queued write, once every write was
    // acknowledged.
    let flush = seen.cmds.iter().position(|c| c.0 == NBD_CMD_FLUSH).unwrap();
    assert_eq!(seen.cmds[flush - 1].2, 131072);
    for &(cmd, off, over, all) in &seen.unreplied {
        if cmd == NBD_CMD_FLUSH {
            assert_eq!(all, 0);
        } else {
            assert_eq!(over, 0, "cmd {cmd} at {off} over an unacknowledged write");
        }
    }
}

/// Writes that are not adjacent, overlap, or are large are not merged;
/// drop sends what is queued.
#[test]
fn no_merge_across_gaps_overlaps_or_large_writes() {
    let (mut srv, dev) = connect(Fake::default());
    let dev = dev.unwrap();
    dev.write_at(&[1u8; 4096], 0).unwrap();
    // A gap of one byte.
    dev.write_at(&[2u8; 4096], 4097).unwrap();
    // Overlapping (a rewrite), and one ending where the queue starts.
    dev.write_at(&[3u8; 4096], 4097).unwrap();
    dev.write_at(&[4u8; 1], 4096).unwrap();
    // As large as the bound: sent at once, not queued.
    dev.write_at(&[5u8; 65536], 8193).unwrap();
    dev.write_at(&[6u8; 512], 8193 + 65536).unwrap();
    drop(dev);
    srv.join();
    assert_eq!(
        writes_seen(&srv),
        vec![
            (0, 4096),
            (4097, 4096),
            (4097, 4096),
            (4096, 1),
            (8193, 65536),
            (8193 + 65536, 512)
        ]
    );
    let d = srv.data.lock().unwrap();
    assert_eq!(&d[4095..4099], &[1, 4, 3, 3]);
    assert_eq!(d[8193 + 65536], 6);
    assert!(srv.seen.lock().unwrap().disconnected);
}

/// A merged write's error names the range and the calls it carried, and
/// sticks; a server gone with writes queued fails at the flush, no hang.
#[test]
fn merged_write_errors_are_reported() {
    let (_srv, dev) = connect(Fake {
        fail: Some((NBD_CMD_WRITE, NBD_ENOSPC)),
        ..Fake::default()
    });
    let dev = dev.unwrap();
    for i in 0..3u64 {
        dev.write_at(&[1u8; 4096], i * 4096).unwrap();
    }
    let e = dev.flush().unwrap_err().to_string();
    assert!(
        e.starts_with("test: write of 12288 bytes at byte 0 (3 writes merged) failed: ")
            && e.contains("ENOSPC"),
        "{e}"
    );
    let mut b = [0u8; 4];
    assert_eq!(dev.read_at(&mut b, 65536).unwrap_err().to_string(), e);
    assert_eq!(dev.write_at(&b, 65536).unwrap_err().to_string(), e);

    let (_srv, dev) = connect(Fake {
        hang_up_after: Some(0),
        ..Fake::default()
    });
    let dev = dev.unwrap();
    dev.write_at(&[1u8; 4096], 0).unwrap();
    dev.write_at(&[1u8; 4096], 4096).unwrap();
    let e = dev.flush().unwrap_err().to_string();
    assert!(
        e.starts_with("test: write of 8192 bytes at byte 0 (2 writes merged) failed: "),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    assert!(dev.flush().is_err());
}

#[test]
fn handshake_errors_name_the_problem() {
    let (_srv, dev) = connect(Fake {
        export: "other",
        ..Fake::default()
    });
    let e = dev.err().unwrap().to_string();
    assert!(
        e.contains("NBD_REP_ERR_UNKNOWN") && e.contains("no such export"),
        "{e}"
    );

    // Not an NBD server at all.
    let (a, mut b) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let _ = b.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    let e = NbdDevice::over_unix(a, "", OpenOptions::read_only(), T)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not an NBD server"), "{e}");
    h.join().unwrap();

    // The server hangs up during the handshake.
    let (a, b) = UnixStream::pair().unwrap();
    drop(b);
    let e = NbdDevice::over_unix(a, "", OpenOptions::read_only(), T)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("closed the connection during the handshake"),
        "{e}"
    );

    // A read-only export refuses a read-write open.
    let (_srv, dev) = connect(Fake {
        flags: NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY,
        ..Fake::default()
    });
    let e = dev.err().unwrap().to_string();
    assert!(e.contains("read-only"), "{e}");
}

#[test]
fn read_only_open_refuses_writes() {
    let (srv, sock) = Server::start(Fake::default());
    let dev = NbdDevice::over_unix(sock, "", OpenOptions::read_only(), T).unwrap();
    assert!(matches!(
        dev.write_at(b"x", 0),
        Err(DeviceError::ReadOnly { .. })
    ));
    assert!(dev.zeroout(0, 512).is_err());
    assert!(dev.discard(0, 512).is_err());
    assert!(dev.write_at(b"x", 1 << 20).is_err());
    drop(dev);
    drop(srv);
}

#[test]
fn bad_uris_are_one_clear_line() {
    for u in ["nbd+unix:///x", "nbds://h/x", "nbd://h:0/x"] {
        let e = crate::open_device(u, OpenOptions::read_only())
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with(&format!("{u}: invalid NBD URI: ")), "{e}");
        assert!(!e.contains('\n'));
    }
    let e = crate::open_device(
        "nbd+unix:///x?socket=/nonexistent-ext4kit.sock",
        OpenOptions::read_only(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("cannot connect: No such file or directory"),
        "{e}"
    );
    assert!(crate::check_not_mounted("nbd://h/x").is_ok());
}

/// Multi-conn: with `NBD_FLAG_CAN_MULTI_CONN` a read-write open uses
/// [`CONNS`] connections, requests go round-robin over them, reads see
/// the writes of every connection, FLUSH comes only once every write on
/// every connection was replied to, and drop disconnects each. Without
/// the flag, or read-only, one connection.
#[test]
fn multi_conn_spreads_requests_and_flushes_after_all() {
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let fake = Fake {
        flags: Fake::default().flags | NBD_FLAG_CAN_MULTI_CONN,
        hold_writes: true,
        gate: Some(Arc::clone(&gate)),
        ..Fake::default()
    };
    let (mut srv, socks) = Server::start_many(fake.clone(), CONNS);
    let dev = NbdDevice::over_unix_many(socks, "", OpenOptions::read_write(), T).unwrap();
    assert_eq!(dev.connections(), CONNS);
    // Eight 64 KiB writes (not small: sent at once) 128 KiB apart, all
    // held by the server behind the gate.
    for i in 0..8u64 {
        dev.write_at(&[i as u8 + 1; 65536], i * 131072).unwrap();
    }
    gate.store(false, std::sync::atomic::Ordering::SeqCst);
    // A read over all of them waits for each (on whatever connection).
    let mut back = vec![0u8; 1 << 20];
    dev.read_at(&mut back, 0).unwrap();
    for i in 0..8usize {
        let at = i * 131072;
        assert!(
            back[at..at + 65536].iter().all(|&b| b == i as u8 + 1),
            "{i}"
        );
        assert!(back[at + 65536..at + 131072].iter().all(|&b| b == 0), "{i}");
    }
    assert_eq!(
        dev.known_zero_ranges(0, 131072).unwrap(),
        vec![(65536, 131072)]
    );
    gate.store(true, std::sync::atomic::Ordering::SeqCst);
    dev.write_at(&[9u8; 65536], 0).unwrap();
    dev.write_at(&[9u8; 65536], 131072).unwrap();
    gate.store(false, std::sync::atomic::Ordering::SeqCst);
    dev.flush().unwrap();
    drop(dev);
    srv.join();
    {
        let seen = srv.seen.lock().unwrap();
        let mut on: Vec<usize> = seen
            .cmds
            .iter()
            .zip(&seen.conn_of)
            .filter(|(c, _)| c.0 == NBD_CMD_WRITE)
            .map(|(_, &id)| id)
            .collect();
        on.sort_unstable();
        on.dedup();
        assert_eq!(on.len(), CONNS, "writes on every connection: {on:?}");
        let flushes: Vec<_> = seen
            .unreplied
            .iter()
            .filter(|u| u.0 == NBD_CMD_FLUSH)
            .collect();
        assert_eq!(flushes.len(), 1);
        assert_eq!(flushes[0].3, 0, "FLUSH after every write was replied");
        assert_eq!(seen.disconnects, CONNS);
    }
    assert_eq!(
        &srv.data.lock().unwrap()[131072..131072 + 65536],
        &[9u8; 65536][..]
    );

    // Without the flag: one connection (the others are not used).
    let (mut srv, socks) = Server::start_many(Fake::default(), 2);
    let dev = NbdDevice::over_unix_many(socks, "", OpenOptions::read_write(), T).unwrap();
    assert_eq!(dev.connections(), 1);
    dev.write_at(&[1u8; 4096], 0).unwrap();
    drop(dev);
    srv.join();
    assert!(srv.seen.lock().unwrap().conn_of.iter().all(|&id| id == 0));
    // Read-only: one connection.
    let (mut srv, socks) = Server::start_many(fake, 2);
    let dev = NbdDevice::over_unix_many(socks, "", OpenOptions::read_only(), T).unwrap();
    assert_eq!(dev.connections(), 1);
    drop(dev);
    srv.join();
}

/// Requests of `cmd` the server saw.
fn count(srv: &Server, cmd: u16) -> usize {
    srv.seen
        .lock()
        .unwrap()
        .cmds
        .iter()
        .filter(|c| c.0 == cmd)
        .count()
}

#[test]
fn known_zero_cache_answers_locally_and_shrinks_on_writes() {
    let (srv, dev) = connect(Fake::default());
    let dev = dev.unwrap();
    // The whole-device question: one request (the export is 1 MiB).
    assert!(dev.is_known_zero(0, 1 << 20).unwrap());
    assert_eq!(count(&srv, NBD_CMD_BLOCK_STATUS), 1);
    // Inside it: answered here, questions and reads alike.
    assert!(dev.is_known_zero(0, 4096).unwrap());
    assert!(dev.is_known_zero((1 << 20) - 4096, 4096).unwrap());
    assert_eq!(
        dev.known_zero_ranges(5000, 300).unwrap(),
        vec![(5000, 5300)]
    );
    let mut b = vec![0xffu8; 8192];
    dev.read_at(&mut b, 65536).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(count(&srv, NBD_CMD_BLOCK_STATUS), 1);
    assert_eq!(count(&srv, NBD_CMD_READ), 0);
    // A write over it shrinks the cache: its range goes to the server.
    dev.write_at(&[7u8; 100], 65536 + 10).unwrap();
    dev.read_at(&mut b, 65536).unwrap();
    assert_eq!(&b[10..110], &[7u8; 100][..]);
    assert_eq!(count(&srv, NBD_CMD_READ), 1);
    assert!(!dev.is_known_zero(65536, 4096).unwrap());
    assert_eq!(count(&srv, NBD_CMD_BLOCK_STATUS), 2);
    // Elsewhere still local.
    dev.read_at(&mut b, 0).unwrap();
    assert!(dev.is_known_zero(131072, 4096).unwrap());
    assert_eq!(count(&srv, NBD_CMD_READ), 1);
    assert_eq!(count(&srv, NBD_CMD_BLOCK_STATUS), 2);
    // Zeroed by us: known without asking.
    dev.zeroout(65536, 4096).unwrap();
    assert!(dev.is_known_zero(65536, 4096).unwrap());
    dev.read_at(&mut b, 65536).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(count(&srv, NBD_CMD_READ), 1);
    assert_eq!(count(&srv, NBD_CMD_BLOCK_STATUS), 2);
    // A TRIM forgets (the content is unspecified until the server says).
    dev.write_at(&[1u8; 4096], 0).unwrap();
    assert_eq!(dev.discard(0, 4096).unwrap(), DiscardOutcome::Zeroed);
    assert!(srv.data.lock().unwrap().iter().all(|&x| x == 0));
}

#[test]
fn known_zero_cache_without_base_allocation() {
    // No BLOCK_STATUS: only what we zeroed is known.
    let (srv, dev) = connect(Fake {
        meta: false,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    assert!(!dev.is_known_zero(0, 4096).unwrap());
    dev.write_at(&[3u8; 8192], 0).unwrap();
    dev.zeroout(0, 8192).unwrap();
    assert!(dev.is_known_zero(0, 4096).unwrap());
    let mut b = vec![0xffu8; 4096];
    dev.read_at(&mut b, 4096).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(count(&srv, NBD_CMD_READ), 0);
    dev.write_at(&[3u8; 1], 4096).unwrap();
    dev.read_at(&mut b, 4096).unwrap();
    assert_eq!(b[0], 3);
    assert_eq!(count(&srv, NBD_CMD_READ), 1);
}

#[test]
fn sequential_reads_are_read_ahead_and_writes_drop_the_window() {
    let (srv, dev) = connect(Fake {
        size: 4 << 20,
        max_payload: 1 << 20,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    let data: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 241) as u8 + 1).collect();
    dev.write_at(&data, 0).unwrap();
    dev.flush().unwrap();
    // 256 sequential 4 KiB reads (1 MiB): windows of 64 KiB doubling to
    // 1 MiB, a handful of requests, not 256.
    let mut b = vec![0u8; 4096];
    for i in 0..256u64 {
        dev.read_at(&mut b, i * 4096).unwrap();
        assert_eq!(&b[..], &data[(i * 4096) as usize..][..4096], "block {i}");
    }
    let reads = count(&srv, NBD_CMD_READ);
    assert!(reads <= 8, "{reads} reads");
    // A write inside the window (queued, not sent): the next read sees it.
    dev.write_at(&[0xEE; 4096], 257 * 4096).unwrap();
    dev.read_at(&mut b, 256 * 4096).unwrap();
    assert_eq!(&b[..], &data[256 * 4096..][..4096]);
    dev.read_at(&mut b, 257 * 4096).unwrap();
    assert_eq!(b, vec![0xEE; 4096]);
    dev.read_at(&mut b, 258 * 4096).unwrap();
    assert_eq!(&b[..], &data[258 * 4096..][..4096]);
    // Zeroout and TRIM over the window drop it too.
    let mut w = vec![0u8; 4096];
    dev.read_at(&mut w, 259 * 4096).unwrap();
    dev.zeroout(260 * 4096, 4096).unwrap();
    dev.read_at(&mut b, 260 * 4096).unwrap();
    assert_eq!(b, vec![0u8; 4096]);
    dev.read_at(&mut b, 261 * 4096).unwrap();
    dev.discard(262 * 4096, 4096).unwrap();
    dev.read_at(&mut b, 262 * 4096).unwrap();
    assert_eq!(b, vec![0u8; 4096]);
    // Random reads fetch no window: one request of 4 KiB each.
    let before = count(&srv, NBD_CMD_READ);
    for i in [10u64, 300, 5, 200] {
        dev.read_at(&mut b, i * 4096).unwrap();
    }
    assert_eq!(count(&srv, NBD_CMD_READ), before + 4);
    let seen = srv.seen.lock().unwrap();
    let last: Vec<u64> = seen.cmds.iter().rev().take(4).map(|c| c.3).collect();
    assert_eq!(last, vec![4096; 4]);
}

#[test]
fn no_read_ahead_with_a_window_of_one() {
    // The one-request-at-a-time client (EXT4KIT_NBD_WINDOW=1, set here
    // on the device, not through the environment).
    let (srv, dev) = connect(Fake {
        size: 4 << 20,
        max_payload: 1 << 20,
        holes: false,
        meta: false,
        ..Fake::default()
    });
    let mut dev = dev.unwrap();
    dev.window = 1;
    let mut b = vec![0u8; 4096];
    for i in 0..16u64 {
        dev.read_at(&mut b, i * 4096).unwrap();
    }
    assert_eq!(count(&srv, NBD_CMD_READ), 16);
}

#[test]
fn extended_headers_carry_every_command() {
    let (mut srv, dev) = connect(Fake {
        extended: true,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    assert!(dev.conn.info.extended && dev.conn.info.structured);
    let buf: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
    dev.write_at(&buf, 8192).unwrap();
    let mut back = vec![0u8; buf.len() + 8192];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back[..8192].iter().all(|&b| b == 0), "a hole chunk");
    assert_eq!(&back[8192..], &buf[..]);
    assert_eq!(
        dev.known_zero_ranges(0, 8192 + 4096).unwrap(),
        vec![(0, 8192)]
    );
    dev.zeroout(8192, 4096).unwrap();
    dev.flush().unwrap();
    drop(dev);
    srv.join();
    assert!(srv.seen.lock().unwrap().disconnected);
}

#[test]
fn extended_headers_ask_block_status_of_a_large_export_once() {
    let size = 16u64 << 30;
    let stored = Some(1 << 20);
    // Without extended headers: 4 GiB − 64 KiB slices, 5 requests.
    let (_srv, dev) = connect(Fake {
        size,
        stored,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    assert!(!dev.conn.info.extended, "the fake refuses the option");
    assert_eq!(dev.known_zero_ranges(0, size).unwrap(), vec![(0, size)]);
    assert_eq!(count(&_srv, NBD_CMD_BLOCK_STATUS), 5);
    drop(dev);
    // With them: one request for the whole export.
    let (srv, dev) = connect(Fake {
        size,
        stored,
        extended: true,
        ..Fake::default()
    });
    let dev = dev.unwrap();
    dev.write_at(&[1u8; 100], 4096).unwrap();
    assert_eq!(
        dev.known_zero_ranges(0, size).unwrap(),
        vec![(0, 4096), (8192, size)]
    );
    assert_eq!(count(&srv, NBD_CMD_BLOCK_STATUS), 1);
    let seen = srv.seen.lock().unwrap();
    let bs = seen
        .cmds
        .iter()
        .find(|c| c.0 == NBD_CMD_BLOCK_STATUS)
        .copied();
    assert_eq!(bs.map(|c| (c.2, c.3)), Some((0, size)));
}

#[test]
fn a_compact_reply_after_extended_headers_is_a_protocol_error() {
    // A server that accepts the option but answers with simple replies.
    let (a, mut b) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || -> std::io::Result<()> {
        b.write_all(&NBDMAGIC.to_be_bytes())?;
        b.write_all(&IHAVEOPT.to_be_bytes())?;
        b.write_all(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes())?;
        read_u32(&mut b)?;
        loop {
            read_u64(&mut b)?;
            let opt = read_u32(&mut b)?;
            let len = read_u32(&mut b)?;
            skip(&mut b, u64::from(len))?;
            match opt {
                NBD_OPT_EXTENDED_HEADERS => opt_reply(&mut b, opt, NBD_REP_ACK, &[]),
                NBD_OPT_GO => {
                    let mut e = NBD_INFO_EXPORT.to_be_bytes().to_vec();
                    e.extend((1u64 << 20).to_be_bytes());
                    e.extend((NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH).to_be_bytes());
                    opt_reply(&mut b, opt, NBD_REP_INFO, &e);
                    opt_reply(&mut b, opt, NBD_REP_ACK, &[]);
                    break;
                }
                _ => opt_reply(&mut b, opt, NBD_REP_ERR_UNSUP, &[]),
            }
        }
        let mut h = [0u8; Request::EXTENDED_SIZE];
        b.read_exact(&mut h)?;
        let r = Request::decode(&h)?;
        b.write_all(&encode_simple_reply(0, r.cookie))?;
        let mut rest = Vec::new();
        let _ = b.read_to_end(&mut rest);
        Ok(())
    });
    let dev = NbdDevice::over_unix(a, "", OpenOptions::read_write(), T).unwrap();
    let e = dev.flush().unwrap_err().to_string();
    assert!(
        e.contains("protocol error") && e.contains("extended headers"),
        "{e}"
    );
    drop(dev);
    h.join().unwrap().unwrap();
}
