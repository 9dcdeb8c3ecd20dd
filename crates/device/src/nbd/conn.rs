//! One NBD connection: the fixed newstyle handshake, then the transmission
//! phase with many requests in flight. Callers write their request (under
//! the writer lock) and wait on their own slot; one reader thread reads
//! every reply, matches it to its slot by cookie and wakes the caller.
//! When the connection breaks (EOF, a protocol violation, a timeout),
//! every waiting and every later request fails with the same reason.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::proto::*;
use super::uri::Address;

/// A TCP or unix stream.
#[derive(Debug)]
pub(crate) enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    pub(crate) fn connect(a: &Address, timeout: Duration) -> io::Result<Sock> {
        match a {
            Address::Unix(p) => Ok(Sock::Unix(UnixStream::connect(p)?)),
            Address::Tcp { host, port } => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address for the host");
                for sa in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&sa, timeout) {
                        Ok(s) => {
                            // Small requests must not wait for Nagle.
                            s.set_nodelay(true)?;
                            return Ok(Sock::Tcp(s));
                        }
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }

    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub(crate) fn set_timeouts(
        &self,
        read: Option<Duration>,
        write: Option<Duration>,
    ) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
            Sock::Unix(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
        }
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.flush(),
            Sock::Unix(s) => s.flush(),
        }
    }
}

/// What the handshake settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExportInfo {
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Structured replies negotiated (also implied by `extended`).
    pub structured: bool,
    /// Extended headers negotiated: 64-bit lengths in requests (one
    /// BLOCK_STATUS for a whole large device), every reply a 32-byte
    /// extended chunk.
    pub extended: bool,
    /// The context id of `base:allocation`, when the server gave one.
    pub alloc_ctx: Option<u32>,
    pub min_block: u32,
    pub pref_block: u32,
    pub max_payload: u32,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

fn hs_err(e: io::Error) -> String {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        "the server closed the connection during the handshake".into()
    } else if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        "the server did not answer the handshake in time".into()
    } else {
        format!("handshake failed: {e}")
    }
}

fn send_option(s: &mut Sock, option: u32, data: &[u8]) -> Result<(), String> {
    s.write_all(&encode_option(option, data)).map_err(hs_err)
}

fn reply_for(s: &mut Sock, option: u32) -> Result<OptionReply, String> {
    let r = read_option_reply(s).map_err(hs_err)?;
    if r.option != option {
        return Err(format!(
            "the server answered option {} to option {option}",
            r.option
        ));
    }
    Ok(r)
}

fn rep_error(what: &str, r: &OptionReply) -> String {
    let m = r.message();
    if m.is_empty() {
        format!("{what}: {}", rep_error_name(r.reply_type))
    } else {
        format!("{what}: {} ({m})", rep_error_name(r.reply_type))
    }
}

/// Whether to ask for extended headers (`EXT4KIT_NBD_EXTENDED=0` says
/// no: to compare with a server that lacks them).
fn want_extended() -> bool {
    std::env::var_os("EXT4KIT_NBD_EXTENDED").is_none_or(|v| v != "0")
}

/// The fixed newstyle handshake for `export`: extended headers (which
/// imply structured replies) or else structured replies, the
/// `base:allocation` context, then NBD_OPT_GO asking for the block sizes
/// (NBD_OPT_EXPORT_NAME when the server does not know NBD_OPT_GO).
pub(crate) fn handshake(s: &mut Sock, export: &str) -> Result<ExportInfo, String> {
    let magic = read_u64(s).map_err(hs_err)?;
    if magic != NBDMAGIC {
        return Err("not an NBD server (no NBDMAGIC)".into());
    }
    let magic = read_u64(s).map_err(hs_err)?;
    if magic == CLISERV_MAGIC {
        return Err("the server speaks the oldstyle protocol, which is not supported".into());
    }
    if magic != IHAVEOPT {
        return Err(format!("bad handshake magic {magic:#x}"));
    }
    let hflags = read_u16(s).map_err(hs_err)?;
    if hflags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        return Err("the server does not support the fixed newstyle handshake".into());
    }
    let no_zeroes = hflags & NBD_FLAG_NO_ZEROES != 0;
    let cflags = NBD_FLAG_C_FIXED_NEWSTYLE | if no_zeroes { NBD_FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&cflags.to_be_bytes()).map_err(hs_err)?;

    let mut extended = false;
    if want_extended() {
        send_option(s, NBD_OPT_EXTENDED_HEADERS, &[])?;
        let r = reply_for(s, NBD_OPT_EXTENDED_HEADERS)?;
        extended = match r.reply_type {
            NBD_REP_ACK => true,
            t if t & NBD_REP_FLAG_ERROR != 0 => false,
            t => return Err(format!("unexpected reply {t} to NBD_OPT_EXTENDED_HEADERS")),
        };
    }
    let structured = extended || {
        send_option(s, NBD_OPT_STRUCTURED_REPLY, &[])?;
        let r = reply_for(s, NBD_OPT_STRUCTURED_REPLY)?;
        match r.reply_type {
            NBD_REP_ACK => true,
            t if t & NBD_REP_FLAG_ERROR != 0 => false,
            t => return Err(format!("unexpected reply {t} to NBD_OPT_STRUCTURED_REPLY")),
        }
    };

    let mut alloc_ctx = None;
    if structured {
        send_option(
            s,
            NBD_OPT_SET_META_CONTEXT,
            &meta_context_data(export, &[BASE_ALLOCATION]),
        )?;
        loop {
            let r = reply_for(s, NBD_OPT_SET_META_CONTEXT)?;
            match r.reply_type {
                NBD_REP_META_CONTEXT if r.data.len() >= 4 => {
                    let id = u32::from_be_bytes([r.data[0], r.data[1], r.data[2], r.data[3]]);
                    if &r.data[4..] == BASE_ALLOCATION.as_bytes() {
                        alloc_ctx = Some(id);
                    }
                }
                NBD_REP_ACK => break,
                NBD_REP_ERR_UNKNOWN => {
                    return Err(rep_error(&format!("export '{export}'"), &r));
                }
                t if t & NBD_REP_FLAG_ERROR != 0 => {
                    // No contexts: no block status; not fatal.
                    alloc_ctx = None;
                    break;
                }
                t => return Err(format!("unexpected reply {t} to NBD_OPT_SET_META_CONTEXT")),
            }
        }
    }

    send_option(s, NBD_OPT_GO, &go_data(export, &[NBD_INFO_BLOCK_SIZE]))?;
    let mut size_flags = None;
    let (mut min_block, mut pref_block, mut max_payload) = (1u32, 4096u32, DEFAULT_MAX_PAYLOAD);
    loop {
        let r = reply_for(s, NBD_OPT_GO)?;
        match r.reply_type {
            NBD_REP_INFO if r.data.len() >= 2 => {
                let d = &r.data;
                let be32 = |i: usize| u32::from_be_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
                match u16::from_be_bytes([d[0], d[1]]) {
                    NBD_INFO_EXPORT if d.len() == 12 => {
                        let size = (u64::from(be32(2)) << 32) | u64::from(be32(6));
                        size_flags = Some((size, u16::from_be_bytes([d[10], d[11]])));
                    }
                    NBD_INFO_BLOCK_SIZE if d.len() == 14 => {
                        (min_block, pref_block, max_payload) = (be32(2), be32(6), be32(10));
                    }
                    _ => {}
                }
            }
            NBD_REP_ACK => break,
            NBD_REP_ERR_UNSUP => {
                // An old server: NBD_OPT_EXPORT_NAME (no errors, no info).
                send_option(s, NBD_OPT_EXPORT_NAME, export.as_bytes())?;
                let size = read_u64(s).map_err(|e| {
                    if e.kind() == io::ErrorKind::UnexpectedEof {
                        format!("the server refused export '{export}'")
                    } else {
                        hs_err(e)
                    }
                })?;
                let flags = read_u16(s).map_err(hs_err)?;
                if !no_zeroes {
                    skip(s, 124).map_err(hs_err)?;
                }
                size_flags = Some((size, flags));
                break;
            }
            t if t & NBD_REP_FLAG_ERROR != 0 => {
                return Err(rep_error(&format!("export '{export}'"), &r));
            }
            t => return Err(format!("unexpected reply {t} to NBD_OPT_GO")),
        }
    }
    let Some((size, flags)) = size_flags else {
        return Err("the server sent no export size".into());
    };
    if !min_block.is_power_of_two() || min_block > 1 << 16 {
        return Err(format!("bad minimum block size {min_block}"));
    }
    if max_payload < min_block {
        return Err(format!("bad maximum payload size {max_payload}"));
    }
    Ok(ExportInfo {
        size,
        flags,
        structured,
        extended,
        alloc_ctx,
        min_block,
        pref_block,
        max_payload: max_payload.min(DEFAULT_MAX_PAYLOAD),
    })
}

/// What a request was, for reading its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read { offset: u64, len: u32 },
    BlockStatus,
    Other,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReqError {
    /// The server replied with an error value (and maybe a message).
    Server { errno: u32, message: String },
    /// The connection is gone (or was never usable for this).
    Conn(String),
}

impl std::fmt::Display for ReqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReqError::Server { errno, message } if message.is_empty() => {
                write!(f, "the server replied {}", errno_name(*errno))
            }
            ReqError::Server { errno, message } => {
                write!(f, "the server replied {} ({message})", errno_name(*errno))
            }
            ReqError::Conn(m) => f.write_str(m),
        }
    }
}

#[derive(Default)]
struct SlotState {
    done: bool,
    error: Option<ReqError>,
    /// A read's data (zeros where the server sent holes).
    data: Vec<u8>,
    /// Bytes of a read the reply covered.
    covered: u64,
    /// A block status reply's descriptors (for `base:allocation`).
    extents: Vec<(u64, u32)>,
}

struct Slot {
    kind: Kind,
    state: Mutex<SlotState>,
    cv: Condvar,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn finish(&self, st: &mut SlotState) {
        st.done = true;
        self.cv.notify_all();
    }
}

#[derive(Default)]
struct Pending {
    slots: HashMap<u64, Arc<Slot>>,
    /// Set once the connection is unusable: why.
    dead: Option<String>,
}

struct Shared {
    pending: Mutex<Pending>,
    alloc_ctx: Option<u32>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// The connection is gone: fail everything in flight.
    fn kill(&self, why: String) {
        let slots: Vec<Arc<Slot>> = {
            let mut p = self.lock();
            if p.dead.is_none() {
                p.dead = Some(why.clone());
            }
            p.slots.drain().map(|(_, s)| s).collect()
        };
        let why = self.lock().dead.clone().unwrap_or(why);
        for s in slots {
            let mut st = s.lock();
            if !st.done {
                st.error = Some(ReqError::Conn(why.clone()));
                s.finish(&mut st);
            }
        }
    }
}

/// A request in flight (clones share it: [`Conn::settle`] waits for it
/// from any of them).
#[derive(Clone)]
pub(crate) struct Ticket(Arc<Slot>);

impl Ticket {
    /// Whether its reply (or the connection's end) has come.
    pub(crate) fn is_done(&self) -> bool {
        self.0.lock().done
    }
}

/// What a completed request returned.
pub(crate) struct Done {
    pub data: Vec<u8>,
    pub extents: Vec<(u64, u32)>,
}

/// The transmission phase of one connection.
pub(crate) struct Conn {
    writer: Mutex<Sock>,
    /// A handle to shut the socket down from any thread.
    ctl: Sock,
    shared: Arc<Shared>,
    reader: Mutex<Option<JoinHandle<()>>>,
    next_cookie: AtomicU64,
    timeout: Duration,
    pub info: ExportInfo,
}

impl Conn {
    /// Start the reader thread on a socket whose handshake is done.
    pub(crate) fn start(sock: Sock, info: ExportInfo, timeout: Duration) -> io::Result<Conn> {
        // Writes must not hang on a stalled server; the reader waits
        // without a limit (callers time out their own requests).
        sock.set_timeouts(None, Some(timeout))?;
        let rsock = sock.try_clone()?;
        let ctl = sock.try_clone()?;
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            alloc_ctx: info.alloc_ctx,
        });
        let sh = Arc::clone(&shared);
        let max_chunk = u64::from(info.max_payload) + 4096;
        let extended = info.extended;
        let reader = std::thread::Builder::new()
            .name("nbd-reader".into())
            .spawn(move || {
                let why = read_loop(rsock, &sh, max_chunk, extended);
                sh.kill(why);
            })?;
        Ok(Conn {
            writer: Mutex::new(sock),
            ctl,
            shared,
            reader: Mutex::new(Some(reader)),
            next_cookie: AtomicU64::new(1),
            timeout,
            info,
        })
    }

    /// Why the connection is unusable, if it is.
    pub(crate) fn dead(&self) -> Option<String> {
        self.shared.lock().dead.clone()
    }

    /// Send one request; `payload` is a write's data. Lengths over 32
    /// bits need extended headers (and a read never has one).
    pub(crate) fn submit(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u64,
        payload: &[u8],
    ) -> Result<Ticket, ReqError> {
        let too_long = || ReqError::Conn(format!("a request of {len} bytes is too long"));
        let hdr = Request {
            flags,
            cmd,
            cookie: 0,
            offset,
            len,
        };
        if !self.info.extended && u32::try_from(len).is_err() {
            return Err(too_long());
        }
        let kind = match cmd {
            NBD_CMD_READ => Kind::Read {
                offset,
                len: u32::try_from(len).map_err(|_| too_long())?,
            },
            NBD_CMD_BLOCK_STATUS => Kind::BlockStatus,
            _ => Kind::Other,
        };
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            kind,
            state: Mutex::new(SlotState {
                data: match kind {
                    Kind::Read { len, .. } => vec![0u8; len as usize],
                    _ => Vec::new(),
                },
                ..SlotState::default()
            }),
            cv: Condvar::new(),
        });
        {
            let mut p = self.shared.lock();
            if let Some(why) = &p.dead {
                return Err(ReqError::Conn(why.clone()));
            }
            // Registered before it is sent: the reply may come at once.
            p.slots.insert(cookie, Arc::clone(&slot));
        }
        let hdr = Request { cookie, ..hdr }
            .encode(self.info.extended)
            .map_err(|e| ReqError::Conn(e.to_string()))?;
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = write_all_parts(&mut *w, &[&hdr, payload]) {
            drop(w);
            let why = if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                format!("the server took no data for {} s", self.timeout.as_secs())
            } else {
                lost(&e)
            };
            // Our reason first, then the reader sees the socket close.
            self.shared.kill(why);
            self.ctl.shutdown();
            return Err(self.conn_error());
        }
        Ok(Ticket(slot))
    }

    fn conn_error(&self) -> ReqError {
        ReqError::Conn(self.dead().unwrap_or_else(|| "the connection broke".into()))
    }

    /// Wait for a request's reply.
    pub(crate) fn wait(&self, t: Ticket) -> Result<Done, ReqError> {
        let slot = t.0;
        let mut st = self.wait_slot(&slot);
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        if let Kind::Read { len, .. } = slot.kind
            && st.covered != u64::from(len)
        {
            return Err(ReqError::Conn(format!(
                "the server's reply to a read of {len} bytes covered {} bytes",
                st.covered
            )));
        }
        Ok(Done {
            data: std::mem::take(&mut st.data),
            extents: std::mem::take(&mut st.extents),
        })
    }

    /// Wait for a request that carries no reply data (a write), leaving
    /// its outcome in place for other holders of the ticket.
    pub(crate) fn settle(&self, t: &Ticket) -> Result<(), ReqError> {
        match self.wait_slot(&t.0).error.clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Wait until `slot` is done (or the connection timed out and died).
    fn wait_slot<'a>(&self, slot: &'a Slot) -> MutexGuard<'a, SlotState> {
        let deadline = Instant::now() + self.timeout;
        let mut st = slot.lock();
        while !st.done {
            let now = Instant::now();
            if now >= deadline {
                drop(st);
                self.shared.kill(format!(
                    "no reply from the server in {} s",
                    self.timeout.as_secs()
                ));
                self.ctl.shutdown();
                st = slot.lock();
                continue;
            }
            st = slot
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.dead().is_none() {
            // A clean end: NBD_CMD_DISC has no reply.
            let hdr = Request {
                flags: 0,
                cmd: NBD_CMD_DISC,
                cookie: 0,
                offset: 0,
                len: 0,
            }
            .encode(self.info.extended);
            if let (Ok(hdr), Ok(mut w)) = (hdr, self.writer.lock()) {
                let _ = write_all_parts(&mut *w, &[&hdr]);
            }
        }
        self.ctl.shutdown();
        let h = self.reader.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

fn lost(e: &io::Error) -> String {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        UnexpectedEof | BrokenPipe | ConnectionReset | ConnectionAborted
    ) {
        "the server closed the connection".into()
    } else {
        format!("the connection broke: {e}")
    }
}

/// The reader thread: returns why it stopped.
fn read_loop(mut r: Sock, sh: &Shared, max_chunk: u64, extended: bool) -> String {
    loop {
        let h = match read_reply_header(&mut r, extended) {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return format!("protocol error from the server: {e}");
            }
            Err(e) => return lost(&e),
        };
        let cookie = h.cookie();
        let Some(slot) = sh.lock().slots.get(&cookie).cloned() else {
            return format!("protocol error from the server: a reply for unknown cookie {cookie}");
        };
        let done = match h {
            ReplyHeader::Simple { error, .. } => {
                let mut st = slot.lock();
                if error != 0 {
                    st.error = Some(ReqError::Server {
                        errno: error,
                        message: String::new(),
                    });
                } else if let Kind::Read { len, .. } = slot.kind {
                    if let Err(e) = r.read_exact(&mut st.data) {
                        return lost(&e);
                    }
                    st.covered = u64::from(len);
                }
                true
            }
            ReplyHeader::Chunk {
                flags,
                chunk_type,
                len,
                ..
            } => {
                if len > max_chunk {
                    return format!("protocol error from the server: a reply chunk of {len} bytes");
                }
                if let Err(why) = read_chunk(&mut r, sh, &slot, chunk_type, len) {
                    return why;
                }
                flags & NBD_REPLY_FLAG_DONE != 0
            }
        };
        if done {
            sh.lock().slots.remove(&cookie);
            let mut st = slot.lock();
            slot.finish(&mut st);
        }
    }
}

/// Read one structured chunk's payload into its slot. `Err`: the
/// connection cannot go on (why).
fn read_chunk(r: &mut Sock, sh: &Shared, slot: &Slot, t: u16, len: u64) -> Result<(), String> {
    let proto = |m: String| format!("protocol error from the server: {m}");
    let payload = |r: &mut Sock| -> Result<Vec<u8>, String> {
        let mut p = vec![0u8; len as usize];
        r.read_exact(&mut p).map_err(|e| lost(&e))?;
        Ok(p)
    };
    match (t, slot.kind) {
        (NBD_REPLY_TYPE_NONE, _) if len == 0 => Ok(()),
        (NBD_REPLY_TYPE_OFFSET_DATA, Kind::Read { offset, len: rlen }) if len >= 8 => {
            let off = read_u64(r).map_err(|e| lost(&e))?;
            let n = len - 8;
            let start = off.checked_sub(offset).filter(|s| s + n <= u64::from(rlen));
            let Some(start) = start else {
                return Err(proto(format!("data chunk at byte {off} outside the read")));
            };
            let mut st = slot.lock();
            let s = start as usize;
            r.read_exact(&mut st.data[s..s + n as usize])
                .map_err(|e| lost(&e))?;
            st.covered += n;
            Ok(())
        }
        (NBD_REPLY_TYPE_OFFSET_HOLE, Kind::Read { offset, len: rlen }) if len == 12 => {
            let off = read_u64(r).map_err(|e| lost(&e))?;
            let n = u64::from(read_u32(r).map_err(|e| lost(&e))?);
            let start = off.checked_sub(offset).filter(|s| s + n <= u64::from(rlen));
            let Some(start) = start else {
                return Err(proto(format!("hole chunk at byte {off} outside the read")));
            };
            let mut st = slot.lock();
            let s = start as usize;
            st.data[s..s + n as usize].fill(0);
            st.covered += n;
            Ok(())
        }
        (NBD_REPLY_TYPE_BLOCK_STATUS | NBD_REPLY_TYPE_BLOCK_STATUS_EXT, Kind::BlockStatus) => {
            let p = payload(r)?;
            let (id, descs) = if t == NBD_REPLY_TYPE_BLOCK_STATUS_EXT {
                decode_block_status_ext(&p)
            } else {
                decode_block_status(&p)
            }
            .map_err(|e| proto(e.to_string()))?;
            if Some(id) == sh.alloc_ctx {
                slot.lock().extents = descs;
            }
            Ok(())
        }
        (t, _) if t & (1 << 15) != 0 => {
            let p = payload(r)?;
            let (errno, message) = decode_error_chunk(&p).map_err(|e| proto(e.to_string()))?;
            let mut st = slot.lock();
            if st.error.is_none() {
                st.error = Some(ReqError::Server {
                    errno: errno.max(1),
                    message,
                });
            }
            Ok(())
        }
        (t, _) => Err(proto(format!(
            "unexpected reply chunk type {t} ({len} bytes)"
        ))),
    }
}

/// One or more connections to the same export, used as one (multi-conn,
/// only when the server advertises `NBD_FLAG_CAN_MULTI_CONN`): requests
/// go round-robin, each ticket remembers its connection. A server serves
/// each connection with its own workers (nbdkit: 16 threads per
/// connection), so N connections keep up to N times as many requests in
/// service. The spec's multi-conn promise is what makes this safe: a
/// FLUSH on any connection covers the writes replied to on all of them,
/// and a write replied to on one is seen by reads on the others.
pub(crate) struct Pool {
    conns: Vec<Conn>,
    next: AtomicU64,
    pub info: ExportInfo,
}

/// A request in flight on one of a [`Pool`]'s connections.
#[derive(Clone)]
pub(crate) struct PoolTicket {
    conn: usize,
    t: Ticket,
}

impl PoolTicket {
    /// Whether its reply (or the connection's end) has come.
    pub(crate) fn is_done(&self) -> bool {
        self.t.is_done()
    }
}

impl Pool {
    /// `conns` (at least one) to the same export; the first one's
    /// export information is the pool's.
    pub(crate) fn new(conns: Vec<Conn>) -> Pool {
        let info = conns[0].info;
        Pool {
            conns,
            next: AtomicU64::new(0),
            info,
        }
    }

    /// How many connections.
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    /// Why a connection is unusable, if one is.
    pub(crate) fn dead(&self) -> Option<String> {
        self.conns.iter().find_map(Conn::dead)
    }

    /// Send one request on the next connection in turn.
    pub(crate) fn submit(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u64,
        payload: &[u8],
    ) -> Result<PoolTicket, ReqError> {
        let n = self.conns.len() as u64;
        let i = (self.next.fetch_add(1, Ordering::Relaxed) % n) as usize;
        let t = self.conns[i].submit(cmd, flags, offset, len, payload)?;
        Ok(PoolTicket { conn: i, t })
    }

    /// Wait for a request's reply.
    pub(crate) fn wait(&self, t: PoolTicket) -> Result<Done, ReqError> {
        self.conns[t.conn].wait(t.t)
    }

    /// Wait for a request without reply data, leaving its outcome in
    /// place ([`Conn::settle`]).
    pub(crate) fn settle(&self, t: &PoolTicket) -> Result<(), ReqError> {
        self.conns[t.conn].settle(&t.t)
    }

    /// Send one request and wait for it.
    pub(crate) fn call(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u64,
        payload: &[u8],
    ) -> Result<Done, ReqError> {
        let t = self.submit(cmd, flags, offset, len, payload)?;
        self.wait(t)
    }
}
