//! A ring of `IORING_OP_URING_CMD` commands with buffers of their own
//! (the `io-uring` crate, SQE128): what FUSE over io_uring needs of
//! io_uring (`crates/fuse/src/uring.rs` lays the FUSE structs into the
//! buffers). Each slot owns a header buffer and a payload buffer, passed
//! to the kernel as two iovecs; the kernel reads and writes them while
//! the slot's command is in flight, so they are never moved or freed
//! then (a ring dropped with commands in flight leaks them). A pipe read
//! kept armed on the ring lets another thread wake the ring's thread
//! ([`Waker`]).

use std::io::{self, PipeReader, PipeWriter, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{IoUring, cqueue, opcode, squeue, types};

/// `user_data` of the wake pipe's read.
const WAKE: u64 = u64::MAX;

struct Slot {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
    in_flight: bool,
}

/// One ring and its slots (see the module's text). Not `Sync`: one
/// thread owns it (the kernel's FUSE copies requests in that thread's
/// task work).
pub struct CmdRing {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    fd: OwnedFd,
    slots: Vec<Slot>,
    wake_rx: PipeReader,
    wake_buf: Box<[u8; 64]>,
    wake_armed: bool,
}

// SAFETY: the only non-`Send` parts are the iovecs' raw pointers, which
// point into the slots' own heap buffers: owned by the ring, moved with
// it, never shared; the ring itself (`IoUring`) is `Send`.
unsafe impl Send for CmdRing {}

/// Wakes the ring's thread from another thread (its [`CmdRing::wait`]
/// returns [`Event::Woken`]).
#[derive(Clone)]
pub struct Waker(Arc<PipeWriter>);

impl Waker {
    pub fn wake(&self) {
        // A full pipe is already a pending wake.
        let _ = (&*self.0).write(&[1]);
    }
}

/// What [`CmdRing::wait`] brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The command of `slot` completed with `res` (< 0: `-errno`).
    Done { slot: usize, res: i32 },
    /// [`Waker::wake`] was called.
    Woken,
}

impl CmdRing {
    /// Give `file` to the ring (a registered, fixed file) and close our
    /// own descriptor of it: its last reference then goes only when the
    /// ring is torn down, after every command of the ring has ended,
    /// also when the process is killed. The mount puts fusermount3's
    /// `auto_unmount` socket here, so fusermount3 looks at the mount
    /// point only once the FUSE connection is fully gone. On an error
    /// the file is given back.
    pub fn hold(&self, file: OwnedFd) -> Result<(), (io::Error, OwnedFd)> {
        use std::os::fd::AsRawFd;
        match self.ring.submitter().register_files(&[file.as_raw_fd()]) {
            Ok(()) => {
                drop(file);
                Ok(())
            }
            Err(e) => Err((e, file)),
        }
    }

    /// A ring for commands on `fd` with `slots` slots of a `header_len`
    /// and a `payload_len` buffer each (zeroed; the memory is taken from
    /// the system only where touched).
    pub fn new(
        fd: OwnedFd,
        slots: usize,
        header_len: usize,
        payload_len: usize,
    ) -> io::Result<(CmdRing, Waker)> {
        let entries = (slots + 1).next_power_of_two() as u32;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(entries)?;
        let (wake_rx, wake_tx) = std::io::pipe()?;
        let slots = (0..slots)
            .map(|_| {
                let mut header = vec![0u8; header_len].into_boxed_slice();
                let mut payload = vec![0u8; payload_len].into_boxed_slice();
                let iov = Box::new([
                    libc::iovec {
                        iov_base: header.as_mut_ptr().cast(),
                        iov_len: header.len(),
                    },
                    libc::iovec {
                        iov_base: payload.as_mut_ptr().cast(),
                        iov_len: payload.len(),
                    },
                ]);
                Slot {
                    header,
                    payload,
                    iov,
                    in_flight: false,
                }
            })
            .collect();
        let r = CmdRing {
            ring,
            fd,
            slots,
            wake_rx,
            wake_buf: Box::new([0; 64]),
            wake_armed: false,
        };
        Ok((r, Waker(Arc::new(wake_tx))))
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The slot's header buffer (while its command is not in flight).
    pub fn header(&self, slot: usize) -> &[u8] {
        &self.slots[slot].header
    }

    pub fn header_mut(&mut self, slot: usize) -> &mut [u8] {
        assert!(!self.slots[slot].in_flight, "slot {slot} is the kernel's");
        &mut self.slots[slot].header
    }

    /// Both buffers of the slot at once (while its command is not in
    /// flight).
    pub fn buffers_mut(&mut self, slot: usize) -> (&mut [u8], &mut [u8]) {
        let s = &mut self.slots[slot];
        assert!(!s.in_flight, "slot {slot} is the kernel's");
        (&mut s.header, &mut s.payload)
    }

    pub fn payload(&self, slot: usize) -> &[u8] {
        &self.slots[slot].payload
    }

    pub fn payload_mut(&mut self, slot: usize) -> &mut [u8] {
        assert!(!self.slots[slot].in_flight, "slot {slot} is the kernel's");
        &mut self.slots[slot].payload
    }

    /// Queue `cmd_op` with its 80-byte command for `slot` (submitted by
    /// the next [`wait`](Self::wait)); with `iovecs`, `addr` points to
    /// the slot's two iovecs and `len` is 2.
    pub fn push(
        &mut self,
        slot: usize,
        cmd_op: u32,
        cmd: [u8; 80],
        iovecs: bool,
    ) -> io::Result<()> {
        let s = &mut self.slots[slot];
        if s.in_flight {
            return Err(io::Error::other(format!("slot {slot} is in flight")));
        }
        let mut op = opcode::UringCmd80::new(types::Fd(self.fd.as_raw_fd()), cmd_op).cmd(cmd);
        if iovecs {
            op = op.addr(Some(s.iov.as_ptr() as u64));
        }
        let mut e = op.build().user_data(slot as u64);
        if iovecs {
            e = set_len(e, 2);
        }
        self.push_entry(&e)?;
        self.slots[slot].in_flight = true;
        Ok(())
    }

    fn push_entry(&mut self, e: &squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every buffer the entry names (a slot's iovec array
            // and the buffers it points to, or `wake_buf`) is heap memory
            // owned by `self` that is neither moved nor freed while the
            // command is in flight (`in_flight`/`wake_armed`; `Drop`
            // leaks them if the ring goes first).
            let pushed = unsafe { self.ring.submission().push(e) };
            if pushed.is_ok() {
                return Ok(());
            }
            // Full: hand what is queued to the kernel, then again.
            self.ring.submit()?;
        }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        if self.wake_armed {
            return Ok(());
        }
        let e: squeue::Entry128 = opcode::Read::new(
            types::Fd(self.wake_rx.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            self.wake_buf.len() as u32,
        )
        .build()
        .user_data(WAKE)
        .into();
        self.push_entry(&e)?;
        self.wake_armed = true;
        Ok(())
    }

    /// Submit what is queued, wait for at least one completion, and put
    /// every completion there is into `out`. EINTR: returns with none.
    pub fn wait(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        self.arm_wake()?;
        match self.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        for c in self.ring.completion() {
            if c.user_data() == WAKE {
                self.wake_armed = false;
                out.push(Event::Woken);
                continue;
            }
            let slot = c.user_data() as usize;
            if let Some(s) = self.slots.get_mut(slot) {
                s.in_flight = false;
                out.push(Event::Done {
                    slot,
                    res: c.result(),
                });
            }
        }
        Ok(())
    }

    /// Slots whose command is in flight.
    pub fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| s.in_flight).count()
    }
}

/// `sqe->len` of a URING_CMD (the crate's builder has no setter for it).
fn set_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // The entry's first 64 bytes are `struct io_uring_sqe`, `len` at
    // offset 24 (`include/uapi/linux/io_uring.h`).
    let mut raw = entry_bytes(&e);
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    entry_from_bytes(raw)
}

fn entry_bytes(e: &squeue::Entry128) -> [u8; 128] {
    const { assert!(size_of::<squeue::Entry128>() == 128) };
    // SAFETY: `Entry128` is `repr(C)` plain data of 128 bytes (asserted
    // above): an io_uring_sqe and its 64 command bytes, no padding
    // that is uninitialised (the builder zeroes the whole entry).
    unsafe { std::mem::transmute_copy(e) }
}

fn entry_from_bytes(b: [u8; 128]) -> squeue::Entry128 {
    // SAFETY: every bit pattern is a valid `Entry128` (plain integers
    // and byte arrays, 128 bytes, asserted in `entry_bytes`).
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(b) }
}

impl Drop for CmdRing {
    fn drop(&mut self) {
        // The kernel may still write to the buffers of commands in flight
        // until the ring is gone: leak them rather than free them.
        if self.in_flight() > 0 {
            for s in std::mem::take(&mut self.slots) {
                std::mem::forget(s);
            }
        }
        if self.wake_armed {
            let b = std::mem::replace(&mut self.wake_buf, Box::new([0; 64]));
            std::mem::forget(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Option<(CmdRing, Waker)> {
        // A pipe has no uring_cmd (/dev/null has one on recent kernels).
        let (fd, _) = std::io::pipe().unwrap();
        let fd = OwnedFd::from(fd);
        match CmdRing::new(fd, 2, 288, 8192) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("skipped: no io_uring here ({e})");
                None
            }
        }
    }

    #[test]
    fn len_lands_in_the_sqe() {
        let e = opcode::UringCmd80::new(types::Fd(3), 1).build();
        let b = entry_bytes(&set_len(e, 2));
        assert_eq!(&b[24..28], &2u32.to_ne_bytes());
        assert_eq!(b[0], io_uring::opcode::UringCmd80::CODE);
    }

    #[test]
    fn a_command_on_a_non_fuse_fd_completes_with_an_error_and_wake_wakes() {
        let Some((mut r, w)) = ring() else { return };
        let mut ev = Vec::new();
        r.push(0, 1, [0; 80], true).unwrap();
        assert!(r.push(0, 1, [0; 80], true).is_err(), "slot 0 is in flight");
        ev.clear();
        while ev.is_empty() {
            r.wait(&mut ev).unwrap();
        }
        match ev[0] {
            Event::Done { slot: 0, res } => assert!(res < 0, "{res}"),
            e => panic!("{e:?}"),
        }
        assert_eq!(r.in_flight(), 0);
        r.header_mut(0)[0] = 1;
        w.wake();
        ev.clear();
        while ev.is_empty() {
            r.wait(&mut ev).unwrap();
        }
        assert_eq!(ev, [Event::Woken]);
    }
}
