//! FUSE over io_uring on our own transport (the default where the kernel
//! offers it, `-o uring` insists; ARCHITECTURE "Our own FUSE transport",
//! io_uring). After INIT granted `FUSE_OVER_IO_URING`, one ring per
//! kernel queue (a queue per possible CPU, `qid` = the CPU of the task
//! making the request) and `per_queue` ring threads per queue, each with
//! `uring_depth` entries: each entry is REGISTERed
//! with its header (`fuse_uring_req_header`) and payload buffers, each
//! completion is a request, rebuilt into the `/dev/fuse` byte form for
//! the same `Request::parse` and `dispatch`, and its reply goes back with
//! COMMIT_AND_FETCH, which also fetches the next one. FORGET, INTERRUPT
//! and the notifies stay on `/dev/fuse` (the session's workers). The
//! rings end when the kernel tears the queues down (ENOTCONN on each
//! entry) or the session stops them.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use ext4kit_device::uring_cmd::{CmdRing, Event, Waker};
use zerocopy::{FromBytes, IntoBytes};

use crate::ops::FuseFs;
use crate::proto::abi::{
    InHeader, OutHeader, URING_IN_OUT_HEADER_SZ, UringCmdReq, UringEntInOut, UringReqHeader,
    uring_cmd,
};
use crate::proto::codec;
use crate::session::{Later, dispatch};

/// `FUSE_OVER_IO_URING` (INIT flags, bit 41).
pub(crate) const OVER_IO_URING: u64 = 1 << 41;
/// The kernel's switch.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
/// `FUSE_MIN_READ_BUFFER`.
const MIN_READ_BUFFER: usize = 8192;

const HEADER: usize = size_of::<UringReqHeader>();
const ENT_IN_OUT: usize = std::mem::offset_of!(UringReqHeader, ring_ent_in_out);
#[cfg(test)]
const OP_IN: usize = std::mem::offset_of!(UringReqHeader, op_in);

/// A request of a ring entry that does not make sense.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum UringError {
    #[error("io_uring entry: header buffer of {0} bytes")]
    ShortHeader(usize),
    #[error("io_uring entry: payload of {said} bytes, the buffer holds {room}")]
    Payload { said: u32, room: usize },
    #[error("io_uring entry: request of {len} bytes with a {payload}-byte payload")]
    Length { len: u32, payload: u32 },
    #[error("io_uring entry: a reply of {0} bytes does not fit")]
    ReplyTooLong(usize),
}

/// The request of a ring entry in the `/dev/fuse` byte form (the
/// in-header, the first argument from `op_in`, the payload), into `out`;
/// its unique. The in-header's `len` counts all arguments, so the first
/// argument's size is `len - 40 - payload_sz`.
pub(crate) fn request_bytes(
    header: &[u8],
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<u64, UringError> {
    let (h, _) = UringReqHeader::read_from_prefix(header)
        .map_err(|_| UringError::ShortHeader(header.len()))?;
    let (ih, _) = InHeader::read_from_prefix(&h.in_out[..])
        .map_err(|_| UringError::ShortHeader(header.len()))?;
    let psz = h.ring_ent_in_out.payload_sz;
    if psz as usize > payload.len() {
        return Err(UringError::Payload {
            said: psz,
            room: payload.len(),
        });
    }
    let op_len = (ih.len as usize)
        .checked_sub(size_of::<InHeader>() + psz as usize)
        .filter(|&n| n <= h.op_in.len())
        .ok_or(UringError::Length {
            len: ih.len,
            payload: psz,
        })?;
    out.clear();
    out.extend_from_slice(ih.as_bytes());
    out.extend_from_slice(&h.op_in[..op_len]);
    out.extend_from_slice(&payload[..psz as usize]);
    Ok(ih.unique)
}

/// A reply (`fuse_out_header` + body, as `dispatch` makes it) into a
/// ring entry: the out header into `in_out`, the body into the payload,
/// its size into `payload_sz`.
pub(crate) fn place_reply(
    msg: &[u8],
    header: &mut [u8],
    payload: &mut [u8],
) -> Result<(), UringError> {
    let oh = size_of::<OutHeader>();
    if header.len() < HEADER || msg.len() < oh {
        return Err(UringError::ShortHeader(header.len()));
    }
    let body = &msg[oh..];
    if body.len() > payload.len() {
        return Err(UringError::ReplyTooLong(msg.len()));
    }
    header[..URING_IN_OUT_HEADER_SZ].fill(0);
    header[..oh].copy_from_slice(&msg[..oh]);
    payload[..body.len()].copy_from_slice(body);
    let eio = UringEntInOut {
        payload_sz: body.len() as u32,
        ..UringEntInOut::default()
    };
    header[ENT_IN_OUT..HEADER].copy_from_slice(eio.as_bytes());
    Ok(())
}

fn cmd(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut c = [0u8; 80];
    let r = UringCmdReq {
        flags: 0,
        commit_id,
        qid,
        padding: [0; 6],
    };
    c[..size_of::<UringCmdReq>()].copy_from_slice(r.as_bytes());
    c
}

/// The kernel's number of queues: `num_possible_cpus()`, from
/// `/sys/devices/system/cpu/possible` ("0-3", "0,2-5").
pub(crate) fn possible_cpus(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// Before the mount (unless `-o nouring`): whether the kernel has FUSE
/// over io_uring, switched on as root when it is off (one line on
/// stderr). `insist`: asked for by `-o uring` (the line says so).
/// `Ok(Some(was))`: usable, `was` the switch before; `Err`: why not.
pub(crate) fn enable(insist: bool) -> Result<Option<bool>, String> {
    enable_at(Path::new(ENABLE_URING), insist)
}

fn enable_at(p: &Path, insist: bool) -> Result<Option<bool>, String> {
    let v = std::fs::read_to_string(p).map_err(|_| {
        format!(
            "the kernel has no FUSE over io_uring ({} missing)",
            p.display()
        )
    })?;
    if v.trim() == "Y" || v.trim() == "1" {
        return Ok(Some(true));
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(format!("{} is N and only root may set it", p.display()));
    }
    std::fs::write(p, "Y").map_err(|e| format!("setting {}: {e}", p.display()))?;
    if insist {
        eprintln!("ext4kit mount: set {} to Y for -o uring", p.display());
    } else {
        eprintln!(
            "ext4kit mount: set {} to Y for FUSE over io_uring (-o nouring: /dev/fuse)",
            p.display()
        );
    }
    Ok(Some(false))
}

/// The rings of a session, made before INIT is answered (so a failure
/// here still falls back: once the kernel has `FUSE_OVER_IO_URING`, it
/// holds every request until all queues are registered).
pub(crate) struct Rings {
    rings: Vec<(u16, CmdRing, Waker)>,
}

impl Rings {
    /// Hold `file` in the first ring until the rings are torn down
    /// ([`CmdRing::hold`]); given back when it cannot.
    pub(crate) fn hold(&self, file: OwnedFd) -> Result<(), OwnedFd> {
        match self.rings.first() {
            Some((_, r, _)) => r.hold(file).map_err(|(e, f)| {
                tracing::debug!("io_uring: registering a file: {e}");
                f
            }),
            None => Err(file),
        }
    }

    /// `per_queue` rings of `depth` entries for each of `queues` queues
    /// on `fd`, with payload buffers of `payload` bytes.
    pub(crate) fn new(
        fd: &File,
        queues: usize,
        per_queue: usize,
        depth: usize,
        payload: usize,
    ) -> io::Result<Rings> {
        let payload = payload.max(MIN_READ_BUFFER);
        let mut rings = Vec::new();
        for qid in 0..queues {
            for _ in 0..per_queue.max(1) {
                let fd = OwnedFd::from(fd.try_clone()?);
                let (r, w) = CmdRing::new(fd, depth.max(1), HEADER, payload)?;
                rings.push((qid as u16, r, w));
            }
        }
        Ok(Rings { rings })
    }

    pub(crate) fn len(&self) -> usize {
        self.rings.len()
    }

    /// A thread per ring; the stopper ends them.
    pub(crate) fn start(
        self,
        fs: &FuseFs,
        destroyed: &Arc<AtomicBool>,
    ) -> io::Result<(Vec<thread::JoinHandle<io::Result<()>>>, Stopper)> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut wakers = Vec::new();
        let mut threads = Vec::new();
        for (i, (qid, ring, waker)) in self.rings.into_iter().enumerate() {
            wakers.push(waker.clone());
            let (fs, destroyed, stop) = (fs.clone(), destroyed.clone(), stop.clone());
            threads.push(
                thread::Builder::new()
                    .name(format!("ext4kit-uring-{qid}.{i}"))
                    .spawn(move || serve(ring, waker, qid, &fs, &destroyed, &stop))?,
            );
        }
        Ok((threads, Stopper { stop, wakers }))
    }
}

/// Ends the ring threads (after the `/dev/fuse` workers saw the end).
pub(crate) struct Stopper {
    stop: Arc<AtomicBool>,
    wakers: Vec<Waker>,
}

impl Stopper {
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in &self.wakers {
            w.wake();
        }
    }
}

fn pin(cpu: usize) {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok()
        && let Err(e) = sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
    {
        tracing::debug!("io_uring queue {cpu}: not pinned: {e}");
    }
}

/// Replies made later (LSEEK's completion) for the ring's entries.
type Deferred = Arc<Mutex<Vec<(usize, Vec<u8>)>>>;

fn serve(
    mut ring: CmdRing,
    waker: Waker,
    qid: u16,
    fs: &FuseFs,
    destroyed: &AtomicBool,
    stop: &AtomicBool,
) -> io::Result<()> {
    // The queue's requests come from tasks on its CPU: serve them there.
    pin(usize::from(qid));
    let deferred: Deferred = Arc::default();
    let slots = ring.slots();
    for slot in 0..slots {
        ring.push(slot, uring_cmd::REGISTER, cmd(qid, 0), true)?;
    }
    let mut events = Vec::new();
    let mut req = Vec::new();
    let mut ended = 0;
    while ended < slots && !stop.load(Ordering::SeqCst) {
        ring.wait(&mut events)?;
        for ev in events.drain(..) {
            match ev {
                Event::Woken => {
                    let later = std::mem::take(&mut *lock(&deferred));
                    for (slot, msg) in later {
                        commit(&mut ring, qid, slot, &msg)?;
                    }
                }
                Event::Done { res, .. } if res < 0 => {
                    ended += 1;
                    if res != -libc::ENOTCONN && res != -libc::ECONNABORTED {
                        tracing::warn!(
                            "FUSE io_uring queue {qid}: {}",
                            io::Error::from_raw_os_error(-res)
                        );
                    }
                }
                Event::Done { slot, .. } => {
                    let unique =
                        match request_bytes(ring.header(slot), ring.payload(slot), &mut req) {
                            Ok(u) => u,
                            Err(e) => {
                                tracing::debug!("{e}");
                                // Answer what the entry's commit id names.
                                let id = UringEntInOut::read_from_prefix(
                                    &ring.header(slot)[ENT_IN_OUT..],
                                )
                                .map(|(e, _)| e.commit_id)
                                .unwrap_or(0);
                                commit(&mut ring, qid, slot, &codec::reply_error(id, libc::EIO))?;
                                continue;
                            }
                        };
                    let later = Cell::new(false);
                    let msg = dispatch(fs, &req, destroyed, || -> Later {
                        later.set(true);
                        let (d, w) = (deferred.clone(), waker.clone());
                        Box::new(move |m| {
                            lock(&d).push((slot, m));
                            w.wake();
                        })
                    });
                    match msg {
                        Some(m) => commit(&mut ring, qid, slot, &m)?,
                        None if later.get() => {}
                        // No reply (FORGET, INTERRUPT: not sent through
                        // the rings); the entry must go back all the same.
                        None => {
                            commit(&mut ring, qid, slot, &codec::reply_error(unique, libc::EIO))?
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The reply into the entry and COMMIT_AND_FETCH (submitted by the next
/// wait). A reply that does not fit is answered EIO.
fn commit(ring: &mut CmdRing, qid: u16, slot: usize, msg: &[u8]) -> io::Result<()> {
    let unique = OutHeader::read_from_prefix(msg)
        .map(|(h, _)| h.unique)
        .unwrap_or(0);
    let placed = {
        let (h, p) = ring.buffers_mut(slot);
        place_reply(msg, h, p)
    };
    if let Err(e) = placed {
        tracing::warn!("{e}");
        let err = codec::reply_error(unique, libc::EIO);
        let (h, p) = ring.buffers_mut(slot);
        place_reply(&err, h, p).map_err(io::Error::other)?;
    }
    ring.push(slot, uring_cmd::COMMIT_AND_FETCH, cmd(qid, unique), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::abi::opcode;

    fn entry(opcode: u32, unique: u64, op: &[u8], payload: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let ih = InHeader {
            len: (40 + op.len() + payload.len()) as u32,
            opcode,
            unique,
            nodeid: 1,
            ..InHeader::default()
        };
        let mut h = vec![0u8; HEADER];
        h[..40].copy_from_slice(ih.as_bytes());
        h[OP_IN..OP_IN + op.len()].copy_from_slice(op);
        let e = UringEntInOut {
            commit_id: unique,
            payload_sz: payload.len() as u32,
            ..UringEntInOut::default()
        };
        h[ENT_IN_OUT..].copy_from_slice(e.as_bytes());
        let mut p = vec![0u8; 4096];
        p[..payload.len()].copy_from_slice(payload);
        (h, p)
    }

    #[test]
    fn a_ring_entry_becomes_the_dev_fuse_bytes() {
        // LOOKUP: an empty first argument, the name in the payload.
        let (h, p) = entry(opcode::LOOKUP, 7, &[], b"name\0");
        let mut out = Vec::new();
        assert_eq!(request_bytes(&h, &p, &mut out), Ok(7));
        assert_eq!(out.len(), 45);
        assert_eq!(&out[40..], b"name\0");
        let r = codec::Request::parse(&out).unwrap();
        assert_eq!(r.op, codec::Operation::Lookup { name: b"name" });
        // WRITE: fuse_write_in in op_in, the data in the payload.
        let (h, p) = entry(opcode::WRITE, 8, &[3; 40], b"data");
        assert_eq!(request_bytes(&h, &p, &mut out), Ok(8));
        assert_eq!(out.len(), 84);
        assert_eq!(&out[40..80], &[3; 40]);
        assert_eq!(&out[80..], b"data");
    }

    #[test]
    fn bad_entries_are_errors() {
        let mut out = Vec::new();
        let (h, p) = entry(opcode::LOOKUP, 7, &[], b"name\0");
        assert!(matches!(
            request_bytes(&h[..100], &p, &mut out),
            Err(UringError::ShortHeader(100))
        ));
        assert!(matches!(
            request_bytes(&h, &p[..3], &mut out),
            Err(UringError::Payload { said: 5, room: 3 })
        ));
        // A len shorter than header + payload, or an op_in part > 128.
        let mut bad = h.clone();
        bad[..4].copy_from_slice(&20u32.to_le_bytes());
        assert!(matches!(
            request_bytes(&bad, &p, &mut out),
            Err(UringError::Length { .. })
        ));
        bad[..4].copy_from_slice(&(40 + 129 + 5u32).to_le_bytes());
        assert!(matches!(
            request_bytes(&bad, &p, &mut out),
            Err(UringError::Length { .. })
        ));
    }

    #[test]
    fn a_reply_lands_in_header_and_payload() {
        let msg = codec::reply(9, &[b"abcdef"]);
        let mut h = vec![0xffu8; HEADER];
        let mut p = vec![0u8; 16];
        place_reply(&msg, &mut h, &mut p).unwrap();
        let (oh, _) = OutHeader::read_from_prefix(&h).unwrap();
        assert_eq!((oh.unique, oh.error), (9, 0));
        assert!(h[16..URING_IN_OUT_HEADER_SZ].iter().all(|&b| b == 0));
        let (e, _) = UringEntInOut::read_from_prefix(&h[ENT_IN_OUT..]).unwrap();
        assert_eq!(e.payload_sz, 6);
        assert_eq!(&p[..6], b"abcdef");
        let long = codec::reply(9, &[&[0u8; 17]]);
        assert!(place_reply(&long, &mut h, &mut p).is_err());
    }

    #[test]
    fn the_command_area_is_fuse_uring_cmd_req() {
        let c = cmd(3, 0x1122);
        assert_eq!(&c[8..16], &0x1122u64.to_le_bytes());
        assert_eq!(&c[16..18], &3u16.to_le_bytes());
        assert!(c[18..].iter().all(|&b| b == 0));
    }

    #[test]
    fn possible_cpus_counts_the_list() {
        assert_eq!(possible_cpus("0-1\n"), Some(2));
        assert_eq!(possible_cpus("0"), Some(1));
        assert_eq!(possible_cpus("0,2-5"), Some(5));
        assert_eq!(possible_cpus(""), None);
        assert_eq!(possible_cpus("x"), None);
    }

    #[test]
    fn enabling_reads_the_switch() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("enable_uring");
        assert!(enable_at(&p, false).is_err());
        std::fs::write(&p, "Y\n").unwrap();
        assert_eq!(enable_at(&p, false), Ok(Some(true)));
        std::fs::write(&p, "N\n").unwrap();
        if nix::unistd::geteuid().is_root() {
            assert_eq!(enable_at(&p, true), Ok(Some(false)));
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "Y");
        } else {
            assert!(enable_at(&p, true).is_err());
        }
    }
}
