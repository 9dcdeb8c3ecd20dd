//! [`NbdDevice`]: an export of an NBD server (qemu-nbd, nbdkit, rbd-nbd,
//! nbd-server) as a [`Device`], spoken to directly over TCP or a unix
//! socket (no kernel nbd module).
//!
//! - `proto`: the wire format, with the spec's names;
//! - `uri`: `nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`;
//! - `conn`: the handshake, and the transmission phase with many requests
//!   in flight (a reader thread matches replies to callers by cookie).
//!
//! Large reads and writes are split into requests of at most the server's
//! maximum payload (and [`MAX_REQUEST`]) and pipelined, [`WINDOW`] at a
//! time per caller. Known-zero ranges come from `NBD_CMD_BLOCK_STATUS` in
//! the `base:allocation` context (`NBD_STATE_ZERO`).
//!
//! Writes are write-behind: `write_at` returns once its requests are
//! sent (at most [`BEHIND_PER_WINDOW`] × the window of them, and
//! [`MAX_BEHIND_BYTES`], outstanding). Any call touching a range with an
//! outstanding write first waits for it (servers may reorder concurrent
//! requests), `flush` and drop wait for all (so an acknowledged FLUSH
//! covers every earlier write), and a behind write's error is reported by
//! the next call and by every call after it.
//!
//! Small writes are merged: a write shorter than [`MERGE_SMALL`] is
//! queued unsent, and a later small write that starts where the queue
//! ends joins it while the total fits the merge bound ([`MAX_MERGE`],
//! capped by the server's maximum payload). The queue is sent by the next write
//! that cannot join, by any call over a range it overlaps, and by `flush`
//! and drop (no timer: correctness never depends on timing).

mod conn;
pub(crate) mod proto;
#[cfg(test)]
mod tests;
mod uri;
mod zeros;

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use conn::{Conn, Done, Pool, PoolTicket as Ticket, ReqError, Sock};
use proto::*;
pub use uri::{NbdUri, is_uri};
use zeros::Zeros;

use crate::{Device, DeviceError, DiscardOutcome, OpenOptions, Result, check_range};

/// The largest read or write request sent (also capped by the server's
/// maximum payload): big enough to amortise a round trip, small enough
/// that a large call has several requests in flight.
pub const MAX_REQUEST: u32 = 8 << 20;
/// Requests one caller keeps in flight (`EXT4KIT_NBD_WINDOW`, 1..=256,
/// overrides it: `scripts/bench-nbd.sh` compares with one at a time).
pub const WINDOW: usize = 16;
/// The largest TRIM / WRITE_ZEROES / BLOCK_STATUS range asked at once:
/// the largest 32-bit length that is a multiple of any minimum block size
/// (4 GiB − 64 KiB), so a whole-device TRIM or zero check of 1 TiB is 257
/// requests, not 1024.
const MAX_RANGE: u64 = 0xFFFF_0000;
/// The BLOCK_STATUS range asked at once with extended headers: any
/// device (one request answers a whole 1 TiB export where the server's
/// reply covers it; a shorter reply is followed up as without them).
/// TRIM and WRITE_ZEROES stay in [`MAX_RANGE`] slices: one request of a
/// whole large device on a server that writes the zeros could outlast
/// the reply timeout.
const EXT_STATUS_RANGE: u64 = 1 << 62;
/// Behind (unacknowledged) writes allowed per request of the window.
pub const BEHIND_PER_WINDOW: usize = 4;
/// Bytes of behind writes allowed.
pub const MAX_BEHIND_BYTES: u64 = 64 << 20;
/// The largest merged write request (also capped by the server's maximum
/// payload and [`MAX_REQUEST`]): adjacent small writes are queued and sent
/// as one request of at most this many bytes.
pub const MAX_MERGE: u64 = 1 << 20;
/// Writes shorter than this are small: queued for merging. Larger ones
/// are sent at once (they already amortise a round trip, and holding
/// them back would only delay the server's work).
pub const MERGE_SMALL: u64 = 128 << 10;
/// Connections opened to a server that advertises
/// `NBD_FLAG_CAN_MULTI_CONN` (`EXT4KIT_NBD_CONNS`, 1..=16, overrides it;
/// always 1 with `EXT4KIT_NBD_WINDOW=1`). A server serves each connection
/// with its own workers (nbdkit: 16 threads each), so at 1 ms of latency
/// mkfs's ~550 small writes and ~260 BLOCK_STATUS requests are bounded
/// by requests / (16 × connections) round trips.
pub const CONNS: usize = 4;
/// The first read-ahead window of a sequential run of reads; it doubles
/// with each read the window served up to [`READ_AHEAD_MAX`].
pub const READ_AHEAD_MIN: u64 = 64 << 10;
/// The largest read-ahead window (also capped by the maximum request).
pub const READ_AHEAD_MAX: u64 = 1 << 20;
/// Default time a request may wait for its reply (`EXT4KIT_NBD_TIMEOUT`,
/// seconds, overrides it).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// An NBD export.
pub struct NbdDevice {
    /// The connection(s): more than one only with multi-conn.
    conn: Pool,
    name: String,
    write: bool,
    /// Requests one caller keeps in flight.
    window: usize,
    /// Serialises read-modify-write of requests smaller than the server's
    /// minimum block size.
    rmw: Mutex<()>,
    /// Writes sent whose replies were not yet seen.
    behind: Mutex<Behind>,
    /// Ranges known to read as zero (`zeros.rs`): BLOCK_STATUS questions
    /// and reads inside them are answered here.
    zeros: Mutex<Zeros>,
    /// The read-ahead window of sequential reads.
    ahead: Mutex<Ahead>,
}

/// Read-ahead state: a read that starts where the previous one ended
/// fetches a window beyond it; later reads inside the window are copied
/// from it. Every write, zeroout and TRIM over the window drops it (and
/// bumps `epoch`, so a window fetched meanwhile is not kept).
#[derive(Default)]
struct Ahead {
    /// Where the last read ended.
    next: u64,
    /// The current window size (0: not sequential).
    run: u64,
    /// The window: its offset and bytes.
    buf: Option<(u64, Vec<u8>)>,
    epoch: u64,
}

impl Ahead {
    fn invalidate(&mut self, s: u64, e: u64) {
        self.epoch += 1;
        if let Some((o, b)) = &self.buf
            && *o < e
            && s < *o + b.len() as u64
        {
            self.buf = None;
        }
    }
}

/// Write-behind state.
#[derive(Default)]
struct Behind {
    /// Each outstanding write, oldest first.
    reqs: VecDeque<Sent>,
    /// Adjacent small writes queued but not sent yet (merged into one
    /// request when sent).
    queued: Option<Queued>,
    /// Their bytes.
    bytes: u64,
    /// The first behind write that failed (its error message): every
    /// later call reports it.
    error: Option<String>,
}

/// An outstanding write request.
struct Sent {
    offset: u64,
    len: u64,
    /// The `write_at` calls it carries (more than one: merged).
    calls: usize,
    ticket: Ticket,
}

/// Writes queued unsent: `data` goes at `offset`, from `calls` calls.
struct Queued {
    offset: u64,
    data: Vec<u8>,
    calls: usize,
}

impl Queued {
    fn overlaps(&self, range: Option<(u64, u64)>) -> bool {
        let (o, l) = (self.offset, self.data.len() as u64);
        range.is_none_or(|(s, n)| o < s + n && s < o + l)
    }
}

/// The message of a failed write request.
fn write_failed(offset: u64, len: u64, calls: usize, e: &ReqError) -> String {
    if calls > 1 {
        format!("write of {len} bytes at byte {offset} ({calls} writes merged) failed: {e}")
    } else {
        format!("write of {len} bytes at byte {offset} failed: {e}")
    }
}

fn window() -> usize {
    std::env::var("EXT4KIT_NBD_WINDOW")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|w| (1..=256).contains(w))
        .unwrap_or(WINDOW)
}

fn conns_wanted(window: usize) -> usize {
    if window == 1 {
        return 1;
    }
    std::env::var("EXT4KIT_NBD_CONNS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=16).contains(n))
        .unwrap_or(CONNS)
}

fn timeout() -> Duration {
    std::env::var("EXT4KIT_NBD_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
}

impl NbdDevice {
    /// Connect to the export `uri` names.
    pub fn open(uri: &str, opts: OpenOptions) -> Result<NbdDevice> {
        let nerr = |m: String| DeviceError::Nbd {
            server: uri.to_string(),
            message: m,
        };
        let parsed = NbdUri::parse(uri).map_err(|m| nerr(format!("invalid NBD URI: {m}")))?;
        let t = timeout();
        let connect = || Sock::connect(&parsed.address, t);
        let mut sock = connect().map_err(|e| nerr(format!("cannot connect: {e}")))?;
        let info = Self::over(&mut sock, &parsed.export, opts, uri, t)?;
        let socks = Self::more(sock, info, &parsed.export, opts, uri, t, connect);
        Self::from_parts(socks, opts, uri, t)
    }

    /// The first connection, plus (multi-conn, read-write opens) up to
    /// [`CONNS`] − 1 more from `connect`. An extra connection that cannot be made, or that
    /// describes the export differently, ends the list: one suffices.
    fn more(
        first: Sock,
        info: conn::ExportInfo,
        export: &str,
        opts: OpenOptions,
        uri: &str,
        t: Duration,
        mut connect: impl FnMut() -> std::io::Result<Sock>,
    ) -> Vec<(Sock, conn::ExportInfo)> {
        let want = conns_wanted(window());
        let mut socks = vec![(first, info)];
        // Read-only opens (mkfs's probes, the tools) read a block at a
        // time: extra connections would only cost their handshakes.
        if !opts.write || !info.has(NBD_FLAG_CAN_MULTI_CONN) {
            return socks;
        }
        while socks.len() < want {
            let Ok(mut s) = connect() else { break };
            match Self::over(&mut s, export, opts, uri, t) {
                Ok(i) if i == info => socks.push((s, i)),
                _ => break,
            }
        }
        socks
    }

    fn over(
        sock: &mut Sock,
        export: &str,
        opts: OpenOptions,
        uri: &str,
        t: Duration,
    ) -> Result<conn::ExportInfo> {
        let nerr = |m: String| DeviceError::Nbd {
            server: uri.to_string(),
            message: m,
        };
        sock.set_timeouts(Some(t), Some(t))
            .map_err(|e| nerr(format!("cannot connect: {e}")))?;
        let info = conn::handshake(sock, export).map_err(nerr)?;
        if opts.write && info.has(NBD_FLAG_READ_ONLY) {
            return Err(nerr("the export is read-only".into()));
        }
        Ok(info)
    }

    fn from_parts(
        socks: Vec<(Sock, conn::ExportInfo)>,
        opts: OpenOptions,
        uri: &str,
        t: Duration,
    ) -> Result<NbdDevice> {
        let mut conns = Vec::with_capacity(socks.len());
        for (sock, info) in socks {
            conns.push(Conn::start(sock, info, t).map_err(|e| DeviceError::Nbd {
                server: uri.to_string(),
                message: format!("cannot start: {e}"),
            })?);
        }
        Ok(NbdDevice {
            conn: Pool::new(conns),
            name: uri.to_string(),
            write: opts.write,
            window: window(),
            rmw: Mutex::new(()),
            behind: Mutex::new(Behind::default()),
            zeros: Mutex::new(Zeros::default()),
            ahead: Mutex::new(Ahead::default()),
        })
    }

    /// A device over an already connected socket (tests: a fake server on
    /// the other end of a socket pair).
    #[cfg(test)]
    pub(crate) fn over_unix(
        s: std::os::unix::net::UnixStream,
        export: &str,
        opts: OpenOptions,
        t: Duration,
    ) -> Result<NbdDevice> {
        Self::over_unix_many(vec![s], export, opts, t)
    }

    /// A device over connected sockets (tests: multi-conn against fake
    /// servers), each used as [`NbdDevice::open`] uses a new connection.
    #[cfg(test)]
    pub(crate) fn over_unix_many(
        socks: Vec<std::os::unix::net::UnixStream>,
        export: &str,
        opts: OpenOptions,
        t: Duration,
    ) -> Result<NbdDevice> {
        let mut rest = socks.into_iter().map(Sock::Unix);
        let mut sock = rest.next().ok_or_else(|| DeviceError::Nbd {
            server: "test".into(),
            message: "no socket".into(),
        })?;
        let info = Self::over(&mut sock, export, opts, "test", t)?;
        let socks = Self::more(sock, info, export, opts, "test", t, || {
            rest.next()
                .ok_or_else(|| std::io::ErrorKind::NotConnected.into())
        });
        Self::from_parts(socks, opts, "test", t)
    }

    /// How many connections the device uses (more than one: multi-conn).
    pub fn connections(&self) -> usize {
        self.conn.len()
    }

    /// Requests in flight per caller: the window on each connection.
    fn inflight(&self) -> usize {
        self.window * self.conn.len()
    }

    fn err(&self, what: &str, offset: u64, len: u64, e: ReqError) -> DeviceError {
        DeviceError::Nbd {
            server: self.name.clone(),
            message: format!("{what} of {len} bytes at byte {offset} failed: {e}"),
        }
    }

    fn behind(&self) -> std::sync::MutexGuard<'_, Behind> {
        self.behind.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn zeros(&self) -> std::sync::MutexGuard<'_, Zeros> {
        self.zeros.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ahead(&self) -> std::sync::MutexGuard<'_, Ahead> {
        self.ahead.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `[s, e)` changes: no zero answer and no read-ahead copy of it
    /// from now on (called before the change is sent or queued).
    fn changing(&self, s: u64, e: u64, zeroes: bool) {
        if !zeroes {
            self.zeros().forget(s, e);
        }
        self.ahead().invalidate(s, e);
    }

    /// Report a failed behind write's error (reap first).
    fn check_sticky(&self) -> Result<()> {
        let mut b = self.behind();
        self.reap(&mut b);
        self.sticky(&b)
    }

    /// An aligned read through the read-ahead window: copied from it when
    /// inside; a sequential read (starting where the last ended) fetches
    /// a window beyond it (doubling per run, [`READ_AHEAD_MIN`] to
    /// [`READ_AHEAD_MAX`]). Off with a window of one request.
    fn read_ahead(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        let max = READ_AHEAD_MAX.min(self.max_request());
        if self.window == 1 || len >= max {
            return self.read_server(buf, offset);
        }
        let (fetch, epoch) = {
            let mut a = self.ahead();
            if let Some((o, b)) = &a.buf
                && *o <= offset
                && offset + len <= *o + b.len() as u64
            {
                let s = (offset - o) as usize;
                buf.copy_from_slice(&b[s..s + buf.len()]);
                a.next = offset + len;
                drop(a);
                return self.check_sticky();
            }
            let sequential = offset == a.next && offset > 0;
            a.next = offset + len;
            a.run = if sequential {
                (a.run * 2).clamp(READ_AHEAD_MIN, max)
            } else {
                0
            };
            let m = self.min_block();
            let end = (offset + a.run).min(self.size()) / m * m;
            (end.max(offset + len) - offset, a.epoch)
        };
        if fetch == len {
            return self.read_server(buf, offset);
        }
        let mut w = vec![0u8; fetch as usize];
        self.read_server(&mut w, offset)?;
        buf.copy_from_slice(&w[..buf.len()]);
        let mut a = self.ahead();
        if a.epoch == epoch {
            a.buf = Some((offset, w));
        }
        Ok(())
    }

    /// Drop the finished writes from `b`, keeping the first error.
    fn reap(&self, b: &mut Behind) {
        let mut freed = 0;
        let mut err = None;
        b.reqs.retain(|r| {
            if !r.ticket.is_done() {
                return true;
            }
            freed += r.len;
            if let Err(e) = self.conn.settle(&r.ticket) {
                err.get_or_insert_with(|| write_failed(r.offset, r.len, r.calls, &e));
            }
            false
        });
        b.bytes -= freed;
        if b.error.is_none() {
            b.error = err;
        }
    }

    /// The sticky error of a failed behind write.
    fn sticky(&self, b: &Behind) -> Result<()> {
        match &b.error {
            Some(m) => Err(DeviceError::Nbd {
                server: self.name.clone(),
                message: m.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Wait for the behind writes overlapping `[offset, offset+len)` (all
    /// of them: `None`), then report any behind write's error.
    /// Queued writes overlapping the range are sent first.
    fn wait_behind(&self, range: Option<(u64, u64)>) -> Result<()> {
        let waits: Vec<Ticket> = {
            let mut b = self.behind();
            self.reap(&mut b);
            if b.queued.as_ref().is_some_and(|q| q.overlaps(range)) {
                self.send_queued(&mut b)?;
            }
            b.reqs
                .iter()
                .filter(|r| range.is_none_or(|(s, n)| r.offset < s + n && s < r.offset + r.len))
                .map(|r| r.ticket.clone())
                .collect()
        };
        for t in &waits {
            // Its outcome is picked up by the reap below.
            let _ = self.conn.settle(t);
        }
        let mut b = self.behind();
        self.reap(&mut b);
        self.sticky(&b)
    }

    /// Wait until a write of `len` more bytes fits the write-behind
    /// bounds (oldest first).
    fn make_room(&self, len: u64) -> Result<()> {
        let max_reqs = self.inflight() * BEHIND_PER_WINDOW;
        loop {
            let oldest = {
                let mut b = self.behind();
                self.reap(&mut b);
                self.sticky(&b)?;
                match b.reqs.front() {
                    Some(r) if b.reqs.len() >= max_reqs || b.bytes + len > MAX_BEHIND_BYTES => {
                        r.ticket.clone()
                    }
                    _ => return Ok(()),
                }
            };
            let _ = self.conn.settle(&oldest);
        }
    }

    /// Send the queued writes as one request, with `b` held throughout
    /// (so that no other call sees the data neither queued nor
    /// outstanding): first wait, oldest first, for room within the
    /// write-behind bounds. A failure is sticky (the calls it carried
    /// have returned).
    fn send_queued(&self, b: &mut Behind) -> Result<()> {
        let Some(q) = b.queued.take() else {
            return Ok(());
        };
        let len = q.data.len() as u64;
        let max_reqs = self.inflight() * BEHIND_PER_WINDOW;
        while let Some(r) = b.reqs.front()
            && (b.reqs.len() >= max_reqs || b.bytes + len > MAX_BEHIND_BYTES)
        {
            let t = r.ticket.clone();
            // Its outcome is picked up by the reap below.
            let _ = self.conn.settle(&t);
            self.reap(b);
        }
        // The queue is bounded by the maximum request (far below 4 GiB).
        match self.conn.submit(NBD_CMD_WRITE, 0, q.offset, len, &q.data) {
            Ok(ticket) => {
                b.reqs.push_back(Sent {
                    offset: q.offset,
                    len,
                    calls: q.calls,
                    ticket,
                });
                b.bytes += len;
                self.sticky(b)
            }
            Err(e) => {
                let m = write_failed(q.offset, len, q.calls, &e);
                b.error.get_or_insert(m);
                self.sticky(b)
            }
        }
    }

    /// The merge bound: the largest queued (merged) write.
    fn max_merge(&self) -> u64 {
        self.max_request().min(MAX_MERGE)
    }

    /// Write an aligned range behind: return once its requests are sent,
    /// or once it is queued (merged with adjacent writes, see
    /// [`MAX_MERGE`]).
    fn write_behind(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        let bound = self.max_merge();
        let small = len < MERGE_SMALL.min(bound);
        loop {
            let waits: Vec<Ticket> = {
                let mut b = self.behind();
                self.reap(&mut b);
                self.sticky(&b)?;
                if let Some(q) = b.queued.as_mut()
                    && small
                    && q.offset + q.data.len() as u64 == offset
                    && q.data.len() as u64 + len <= bound
                {
                    q.data.extend_from_slice(buf);
                    q.calls += 1;
                    return Ok(());
                }
                // Not adjacent (or too large): what is queued goes first.
                self.send_queued(&mut b)?;
                let waits: Vec<Ticket> = b
                    .reqs
                    .iter()
                    .filter(|r| r.offset < offset + len && offset < r.offset + r.len)
                    .map(|r| r.ticket.clone())
                    .collect();
                if waits.is_empty() {
                    if small {
                        b.queued = Some(Queued {
                            offset,
                            data: buf.to_vec(),
                            calls: 1,
                        });
                        return Ok(());
                    }
                    break;
                }
                waits
            };
            // Overlapping outstanding writes first (their outcome is
            // picked up by the next reap).
            for t in &waits {
                let _ = self.conn.settle(t);
            }
        }
        for (o, l) in Self::split(offset, buf.len() as u64, self.max_request()) {
            self.make_room(l)?;
            let s = (o - offset) as usize;
            let t = self
                .conn
                .submit(NBD_CMD_WRITE, 0, o, l, &buf[s..s + l as usize])
                .map_err(|e| self.err("write", o, l, e))?;
            let mut b = self.behind();
            b.reqs.push_back(Sent {
                offset: o,
                len: l,
                calls: 1,
                ticket: t,
            });
            b.bytes += l;
        }
        Ok(())
    }

    /// [`Device::write_at`] after its checks.
    fn write_inner(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        if self.aligned(offset, len) {
            return self.write_aligned(buf, offset);
        }
        // Smaller than the server's minimum block: read, modify, write.
        let _g = self.rmw.lock().unwrap_or_else(|p| p.into_inner());
        let (s, e) = self.widen(offset, len);
        let mut tmp = vec![0u8; (e - s) as usize];
        self.read_aligned(&mut tmp, s)?;
        let o = (offset - s) as usize;
        tmp[o..o + buf.len()].copy_from_slice(buf);
        self.write_aligned(&tmp, s)
    }

    /// [`Device::zeroout`] after its checks.
    fn zeroout_inner(&self, offset: u64, len: u64) -> Result<()> {
        self.wait_behind(Some((offset, len)))?;
        // Edges smaller than the server's minimum block: zeros written
        // (read-modify-write).
        let m = self.min_block();
        let end = offset + len;
        let (a, b) = (offset.div_ceil(m) * m, end / m * m);
        if a >= b {
            self.write_at(&vec![0u8; len as usize], offset)?;
            let mut z = self.zeros();
            let epoch = z.generation();
            z.learn_since(epoch, offset, end);
            return Ok(());
        }
        if a > offset {
            self.write_at(&vec![0u8; (a - offset) as usize], offset)?;
        }
        if end > b {
            self.write_at(&vec![0u8; (end - b) as usize], b)?;
        }
        // Zeroed from here on, unless someone writes meanwhile: the epoch,
        // then any write over the range queued before it is sent and
        // answered, so our WRITE_ZEROES comes after it.
        let epoch = self.zeros().generation();
        self.wait_behind(Some((a, b - a)))?;
        if !self.conn.info.has(NBD_FLAG_SEND_WRITE_ZEROES) {
            self.write_zero_data(a, b - a)?;
        } else {
            match self.write_zeroes(a, b - a) {
                // A server that advertises WRITE_ZEROES but cannot do it here.
                Err(Failed(_, _, ReqError::Server { errno, .. }))
                    if errno == NBD_ENOTSUP || errno == NBD_EINVAL =>
                {
                    self.write_zero_data(a, b - a)?
                }
                Err(f) => return Err(self.failed("write zeroes", f)),
                Ok(()) => {}
            }
        }
        self.zeros().learn_since(epoch, offset, end);
        Ok(())
    }
    /// [`Device::discard`] after its checks: `Zeroed` where the range
    /// was all holes already (no TRIM sent), else `Discarded` (the caller
    /// asks BLOCK_STATUS afresh).
    fn discard_inner(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        self.wait_behind(Some((offset, len)))?;
        let m = self.min_block();
        let (a, b) = (offset.div_ceil(m) * m, (offset + len) / m * m);
        // A TRIM of what is already a hole does nothing: skip it (mkfs's
        // whole-device discard of a fresh thin export).
        if a < b {
            if self.all_holes(a, b - a)? {
                if (a, b) == (offset, offset + len) {
                    // Known zero already: no second look.
                    return Ok(DiscardOutcome::Zeroed);
                }
            } else {
                let reqs = Self::split(a, b - a, MAX_RANGE);
                self.pipeline(NBD_CMD_TRIM, &reqs, &|_, _| &[], &mut |_, _| {})
                    .map_err(|f| self.failed("trim", f))?;
            }
        }
        Ok(DiscardOutcome::Discarded)
    }

    fn check_write(&self) -> Result<()> {
        if self.write {
            Ok(())
        } else {
            Err(DeviceError::ReadOnly {
                path: self.name.clone().into(),
            })
        }
    }

    fn max_request(&self) -> u64 {
        let m = self.conn.info.max_payload.min(MAX_REQUEST);
        // A multiple of the minimum block size.
        u64::from(m - m % self.conn.info.min_block)
    }

    /// The largest BLOCK_STATUS range asked in one request.
    fn status_range(&self) -> u64 {
        if self.conn.info.extended {
            EXT_STATUS_RANGE
        } else {
            MAX_RANGE
        }
    }

    fn min_block(&self) -> u64 {
        u64::from(self.conn.info.min_block)
    }

    /// Run `reqs` (offset, len) of `cmd`, `window` in flight; `payload`
    /// gives a request's data, `done` takes a reply.
    fn pipeline<'a>(
        &self,
        cmd: u16,
        reqs: &[(u64, u64)],
        payload: &dyn Fn(u64, u64) -> &'a [u8],
        done: &mut dyn FnMut(u64, Done),
    ) -> std::result::Result<(), Failed> {
        let mut in_flight: VecDeque<(u64, u64, Ticket)> = VecDeque::new();
        let mut first_err = None;
        for &(off, len) in reqs {
            if in_flight.len() >= self.inflight()
                && let Some((o, l, t)) = in_flight.pop_front()
            {
                match self.conn.wait(t) {
                    Ok(d) => done(o, d),
                    Err(e) => {
                        first_err = Some(Failed(o, l, e));
                        break;
                    }
                }
            }
            match self.conn.submit(cmd, 0, off, len, payload(off, len)) {
                Ok(t) => in_flight.push_back((off, len, t)),
                Err(e) => {
                    first_err = Some(Failed(off, len, e));
                    break;
                }
            }
        }
        // Everything sent is waited for, also after an error.
        for (o, l, t) in in_flight {
            match self.conn.wait(t) {
                Ok(d) => done(o, d),
                Err(e) => {
                    first_err.get_or_insert(Failed(o, l, e));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn failed(&self, what: &str, f: Failed) -> DeviceError {
        self.err(what, f.0, f.1, f.2)
    }

    /// Split `[offset, offset+len)` into requests of at most `max`.
    fn split(offset: u64, len: u64, max: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::with_capacity(len.div_ceil(max.max(1)) as usize);
        let mut o = offset;
        let end = offset + len;
        while o < end {
            let n = (end - o).min(max);
            v.push((o, n));
            o += n;
        }
        v
    }

    fn aligned(&self, offset: u64, len: u64) -> bool {
        let m = self.min_block();
        offset.is_multiple_of(m) && len.is_multiple_of(m)
    }

    /// Read an aligned range (after the behind writes it overlaps); a
    /// range known to be zero is filled here (after a failed behind
    /// write's error, like any read).
    fn read_aligned(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if self.zeros().covers(offset, offset + buf.len() as u64) {
            self.check_sticky()?;
            buf.fill(0);
            return Ok(());
        }
        self.read_ahead(buf, offset)
    }

    /// Read an aligned range from the server.
    fn read_server(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.wait_behind(Some((offset, buf.len() as u64)))?;
        let reqs = Self::split(offset, buf.len() as u64, self.max_request());
        self.pipeline(NBD_CMD_READ, &reqs, &|_, _| &[], &mut |o, d| {
            let s = (o - offset) as usize;
            buf[s..s + d.data.len()].copy_from_slice(&d.data);
        })
        .map_err(|f| self.failed("read", f))
    }

    /// Write an aligned range: behind, or one window at a time when the
    /// window is 1 (the one-request-at-a-time client).
    fn write_aligned(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.window > 1 {
            return self.write_behind(buf, offset);
        }
        self.wait_behind(Some((offset, buf.len() as u64)))?;
        let reqs = Self::split(offset, buf.len() as u64, self.max_request());
        self.pipeline(
            NBD_CMD_WRITE,
            &reqs,
            &|o, l| &buf[(o - offset) as usize..(o - offset + l) as usize],
            &mut |_, _| {},
        )
        .map_err(|f| self.failed("write", f))
    }

    /// The covering aligned range of `[offset, offset+len)`.
    fn widen(&self, offset: u64, len: u64) -> (u64, u64) {
        let m = self.min_block();
        let s = offset - offset % m;
        let e = (offset + len).div_ceil(m) * m;
        (s, e.min(self.size().max(s)))
    }

    /// `base:allocation` extents over `[offset, offset+len)`: (start, end,
    /// flags), clipped to the range, in order.
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64, u32)>> {
        let mut out: Vec<(u64, u64, u32)> = Vec::new();
        if self.conn.info.alloc_ctx.is_none() || len == 0 {
            return Ok(out);
        }
        // The epoch before waiting: a write queued before it is sent and
        // answered by the wait (so the reply covers it), one after it
        // bumps the epoch (so the reply is not learnt).
        let epoch = self.zeros().generation();
        self.wait_behind(Some((offset, len)))?;
        // Slices of `status_range` asked a window at a time; a reply
        // that covers less than its slice is followed up one at a time.
        let range = self.status_range();
        let slices = Self::split(offset, len, range);
        let mut got: Vec<Vec<(u64, u32)>> = vec![Vec::new(); slices.len()];
        self.pipeline(NBD_CMD_BLOCK_STATUS, &slices, &|_, _| &[], &mut |o, d| {
            got[((o - offset) / range) as usize] = d.extents;
        })
        .map_err(|f| self.failed("block status", f))?;
        for (&(s, n), descs) in slices.iter().zip(got) {
            let end = s + n;
            let mut cur = s;
            let mut descs = descs;
            loop {
                let asked = end - cur;
                if descs.is_empty() {
                    return Err(self.err(
                        "block status",
                        cur,
                        asked,
                        ReqError::Conn("the server sent no base:allocation extents".into()),
                    ));
                }
                for (l, flags) in descs {
                    if cur >= end {
                        break;
                    }
                    if l == 0 {
                        return Err(self.err(
                            "block status",
                            cur,
                            asked,
                            ReqError::Conn("the server sent an empty extent".into()),
                        ));
                    }
                    let e = cur.saturating_add(l).min(end);
                    match out.last_mut() {
                        Some(last) if last.1 == cur && last.2 == flags => last.1 = e,
                        _ => out.push((cur, e, flags)),
                    }
                    cur = e;
                }
                if cur >= end {
                    break;
                }
                let n = end - cur;
                descs = self
                    .conn
                    .call(NBD_CMD_BLOCK_STATUS, 0, cur, n, &[])
                    .map_err(|e| self.err("block status", cur, n, e))?
                    .extents;
            }
        }
        let mut z = self.zeros();
        for &(s, e, f) in &out {
            if f & NBD_STATE_ZERO != 0 {
                z.learn_since(epoch, s, e);
            }
        }
        Ok(out)
    }

    /// Whether BLOCK_STATUS reports all of `[offset, offset+len)` as a
    /// zero hole. Cheap either way: the slices are asked a window at a
    /// time, the first allocated extent answers false, and only short
    /// replies over holes are followed up.
    fn all_holes(&self, offset: u64, len: u64) -> Result<bool> {
        const BOTH: u32 = NBD_STATE_HOLE | NBD_STATE_ZERO;
        if self.conn.info.alloc_ctx.is_none() || len == 0 {
            return Ok(false);
        }
        // The epoch before waiting (see `extents`).
        let epoch = self.zeros().generation();
        self.wait_behind(Some((offset, len)))?;
        let range = self.status_range();
        let slices = Self::split(offset, len, range);
        let mut holes = true;
        let mut rest: Vec<(u64, u64)> = Vec::new();
        self.pipeline(NBD_CMD_BLOCK_STATUS, &slices, &|_, _| &[], &mut |o, d| {
            let end = o.saturating_add(range).min(offset + len);
            let mut cur = o;
            for (l, f) in d.extents {
                if cur >= end {
                    break;
                }
                if l == 0 || f & BOTH != BOTH {
                    holes = false;
                    return;
                }
                cur = cur.saturating_add(l);
            }
            if cur < end {
                rest.push((cur, end - cur));
            }
        })
        .map_err(|f| self.failed("block status", f))?;
        if !holes {
            return Ok(false);
        }
        for (s, n) in rest {
            if !self.extents(s, n)?.iter().all(|e| e.2 & BOTH == BOTH) {
                return Ok(false);
            }
        }
        self.zeros().learn_since(epoch, offset, offset + len);
        Ok(true)
    }

    /// WRITE_ZEROES over an aligned range (the server may punch holes).
    fn write_zeroes(&self, offset: u64, len: u64) -> std::result::Result<(), Failed> {
        let reqs = Self::split(offset, len, MAX_RANGE);
        self.pipeline(NBD_CMD_WRITE_ZEROES, &reqs, &|_, _| &[], &mut |_, _| {})
    }

    /// Zeros written as data over an aligned range.
    fn write_zero_data(&self, offset: u64, len: u64) -> Result<()> {
        let chunk = self.max_request().min(1 << 20);
        let zeros = vec![0u8; chunk as usize];
        let reqs = Self::split(offset, len, chunk);
        self.pipeline(
            NBD_CMD_WRITE,
            &reqs,
            &|_, l| &zeros[..l as usize],
            &mut |_, _| {},
        )
        .map_err(|f| self.failed("write", f))
    }
}

impl Drop for NbdDevice {
    /// Wait for the behind writes (their errors are lost here: callers
    /// that care flush first), then the connection says NBD_CMD_DISC.
    fn drop(&mut self) {
        let _ = self.wait_behind(None);
    }
}

/// A request that failed: its offset, length and why.
struct Failed(u64, u64, ReqError);

impl Device for NbdDevice {
    fn size(&self) -> u64 {
        self.conn.info.size
    }

    /// The server's minimum block size, at least 512.
    fn logical_block_size(&self) -> u32 {
        self.conn.info.min_block.max(512)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        check_range(offset, len, self.size())?;
        if len == 0 {
            return Ok(());
        }
        if self.aligned(offset, len) {
            return self.read_aligned(buf, offset);
        }
        let (s, e) = self.widen(offset, len);
        let mut tmp = vec![0u8; (e - s) as usize];
        self.read_aligned(&mut tmp, s)?;
        let o = (offset - s) as usize;
        buf.copy_from_slice(&tmp[o..o + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_write()?;
        let len = buf.len() as u64;
        check_range(offset, len, self.size())?;
        if len == 0 {
            return Ok(());
        }
        // Before the write is sent or queued: no one answers "zero" (or
        // from the read-ahead window) here from now on; and again once it
        // is queued or sent, so that an answer fetched meanwhile (by
        // another thread, before it could see this write) is not kept.
        self.changing(offset, offset + len, false);
        let r = self.write_inner(buf, offset);
        self.changing(offset, offset + len, false);
        r
    }

    /// Waits for every behind write first: the server's FLUSH covers
    /// only writes it has replied to.
    fn flush(&self) -> Result<()> {
        self.wait_behind(None)?;
        if !self.write || !self.conn.info.has(NBD_FLAG_SEND_FLUSH) {
            // Without NBD_FLAG_SEND_FLUSH the server has no write cache
            // to flush (the client must not send it).
            return match self.conn.dead() {
                Some(why) => Err(self.err("flush", 0, 0, ReqError::Conn(why))),
                None => Ok(()),
            };
        }
        self.conn
            .call(NBD_CMD_FLUSH, 0, 0, 0, &[])
            .map(|_| ())
            .map_err(|e| self.err("flush", 0, 0, e))
    }

    /// WRITE_ZEROES without NBD_CMD_FLAG_NO_HOLE (the server may punch),
    /// or zeros written when the server has no WRITE_ZEROES.
    fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write()?;
        check_range(offset, len, self.size())?;
        if len == 0 {
            return Ok(());
        }
        // The read-ahead window is dropped before and after (see
        // `write_at`); the zero cache learns the range at the end.
        self.changing(offset, offset + len, true);
        let r = self.zeroout_inner(offset, len);
        self.changing(offset, offset + len, true);
        r
    }

    /// TRIM; `Zeroed` when BLOCK_STATUS then reports the range as zero.
    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        self.check_write()?;
        check_range(offset, len, self.size())?;
        if !self.conn.info.has(NBD_FLAG_SEND_TRIM) {
            return Ok(DiscardOutcome::Unsupported);
        }
        // A TRIM leaves the content unspecified until BLOCK_STATUS says
        // otherwise (before and after, as `write_at`).
        self.changing(offset, offset + len, false);
        let r = self.discard_inner(offset, len);
        if let Ok(DiscardOutcome::Zeroed) = r {
            // All holes: no TRIM went out, nothing changed (and the
            // cache learnt the range).
            return r;
        }
        self.changing(offset, offset + len, false);
        r?;
        // The range as the server now reports it (learnt afresh).
        if self.is_known_zero(offset, len)? {
            Ok(DiscardOutcome::Zeroed)
        } else {
            Ok(DiscardOutcome::Discarded)
        }
    }

    /// True when a discard can be checked: the server trims and reports
    /// `base:allocation`. [`NbdDevice::discard`] says `Zeroed` only when
    /// the server then reports the range as zero.
    fn discard_zeroes_data(&self) -> bool {
        self.conn.info.has(NBD_FLAG_SEND_TRIM) && self.conn.info.alloc_ctx.is_some()
    }

    /// Ranges BLOCK_STATUS reports with `NBD_STATE_ZERO`; a range the
    /// known-zero cache covers whole is answered without a request.
    fn known_zero_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        check_range(offset, len, self.size())?;
        let mut out: Vec<(u64, u64)> = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        if self.zeros().covers(offset, offset + len) {
            // A failed behind write is still reported.
            self.check_sticky()?;
            return Ok(vec![(offset, offset + len)]);
        }
        for (s, e, f) in self.extents(offset, len)? {
            if f & NBD_STATE_ZERO == 0 {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        Ok(out)
    }

    fn reports_allocation(&self) -> bool {
        self.conn.info.alloc_ctx.is_some()
    }

    /// The bytes BLOCK_STATUS does not report as holes.
    fn allocated_bytes(&self) -> Option<u64> {
        let ext = self.extents(0, self.size()).ok()?;
        if ext.is_empty() {
            return None;
        }
        Some(
            ext.iter()
                .filter(|(_, _, f)| f & NBD_STATE_HOLE == 0)
                .map(|(s, e, _)| e - s)
                .sum(),
        )
    }

    fn is_rotational(&self) -> Option<bool> {
        Some(self.conn.info.has(NBD_FLAG_ROTATIONAL))
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}
