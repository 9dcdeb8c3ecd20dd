//! The NBD wire format (doc/proto.md of the NBD project): constants with
//! the spec's names, and the encoding and decoding of the messages the
//! client sends and receives. No I/O beyond `Read`/`Write` of one message.

// The spec's whole table is here, also what this client does not send.
#![allow(dead_code)]

use std::io::{self, Read, Write};

/// 'NBDMAGIC', the first thing a server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// 'IHAVEOPT': newstyle negotiation (server) and every option (client).
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The oldstyle negotiation's second magic (not supported).
pub const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Magic of every option reply.
pub const NBD_REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Requests and replies once `NBD_OPT_EXTENDED_HEADERS` is negotiated.
pub const NBD_EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
pub const NBD_EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// Handshake flags (server) and client flags.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;
pub const NBD_REP_ERR_EXT_HEADER_REQD: u32 = NBD_REP_FLAG_ERROR | 10;

// Information types (NBD_REP_INFO).
pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured replies.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Block status with 64-bit lengths and flags (extended headers).
pub const NBD_REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// base:allocation flags.
pub const NBD_STATE_HOLE: u32 = 1 << 0;
pub const NBD_STATE_ZERO: u32 = 1 << 1;

// Error values.
pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_ENOMEM: u32 = 12;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;
pub const NBD_ENOTSUP: u32 = 95;
pub const NBD_ESHUTDOWN: u32 = 108;

/// The metadata context this client asks for.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// The largest option reply this client reads (a server's message or an
/// info item; anything bigger is a broken server).
pub const MAX_OPTION_REPLY: u32 = 1 << 20;
/// The default maximum payload (2^25), also the cap on what a server
/// may advertise being used.
pub const DEFAULT_MAX_PAYLOAD: u32 = 1 << 25;

/// The spec's name of an error value, for messages.
pub fn errno_name(e: u32) -> String {
    match e {
        NBD_EPERM => "EPERM (operation not permitted)".into(),
        NBD_EIO => "EIO (input/output error)".into(),
        NBD_ENOMEM => "ENOMEM (cannot allocate memory)".into(),
        NBD_EINVAL => "EINVAL (invalid argument)".into(),
        NBD_ENOSPC => "ENOSPC (no space left on device)".into(),
        NBD_EOVERFLOW => "EOVERFLOW (value too large)".into(),
        NBD_ENOTSUP => "ENOTSUP (operation not supported)".into(),
        NBD_ESHUTDOWN => "ESHUTDOWN (server is shutting down)".into(),
        e => format!("error {e}"),
    }
}

/// The OS error an NBD error value stands for.
pub fn errno_to_io(e: u32) -> io::Error {
    let raw = match e {
        NBD_EPERM => libc::EPERM,
        NBD_ENOMEM => libc::ENOMEM,
        NBD_EINVAL => libc::EINVAL,
        NBD_ENOSPC => libc::ENOSPC,
        NBD_EOVERFLOW => libc::EOVERFLOW,
        NBD_ENOTSUP => libc::EOPNOTSUPP,
        NBD_ESHUTDOWN => libc::ESHUTDOWN,
        _ => libc::EIO,
    };
    io::Error::from_raw_os_error(raw)
}

/// The spec's name of an option reply error, for messages.
pub fn rep_error_name(t: u32) -> String {
    match t {
        NBD_REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP (option not supported)".into(),
        NBD_REP_ERR_POLICY => "NBD_REP_ERR_POLICY (forbidden by server policy)".into(),
        NBD_REP_ERR_INVALID => "NBD_REP_ERR_INVALID (invalid option)".into(),
        NBD_REP_ERR_PLATFORM => {
            "NBD_REP_ERR_PLATFORM (not supported on the server's platform)".into()
        }
        NBD_REP_ERR_TLS_REQD => "NBD_REP_ERR_TLS_REQD (the server requires TLS)".into(),
        NBD_REP_ERR_UNKNOWN => "NBD_REP_ERR_UNKNOWN (no such export)".into(),
        NBD_REP_ERR_SHUTDOWN => "NBD_REP_ERR_SHUTDOWN (server is shutting down)".into(),
        NBD_REP_ERR_BLOCK_SIZE_REQD => "NBD_REP_ERR_BLOCK_SIZE_REQD".into(),
        NBD_REP_ERR_TOO_BIG => "NBD_REP_ERR_TOO_BIG".into(),
        t => format!("option reply {t:#x}"),
    }
}

pub fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Read and drop `n` bytes.
pub fn skip(r: &mut impl Read, n: u64) -> io::Result<()> {
    let got = io::copy(&mut r.take(n), &mut io::sink())?;
    if got < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// An option request: IHAVEOPT, option, length, data.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// The data of NBD_OPT_GO: name, then the information requests.
pub fn go_data(export: &str, infos: &[u16]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(
        &u32::try_from(export.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    v.extend_from_slice(export.as_bytes());
    v.extend_from_slice(&u16::try_from(infos.len()).unwrap_or(0).to_be_bytes());
    for i in infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

/// The data of NBD_OPT_SET_META_CONTEXT: name, then the queries.
pub fn meta_context_data(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(
        &u32::try_from(export.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    v.extend_from_slice(export.as_bytes());
    v.extend_from_slice(&u32::try_from(queries.len()).unwrap_or(0).to_be_bytes());
    for q in queries {
        v.extend_from_slice(&u32::try_from(q.len()).unwrap_or(u32::MAX).to_be_bytes());
        v.extend_from_slice(q.as_bytes());
    }
    v
}

/// One option reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

impl OptionReply {
    /// The server's message of an error reply (its data as text).
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.data).trim().to_string()
    }
}

/// Read one option reply (and check its magic and size).
pub fn read_option_reply(r: &mut impl Read) -> io::Result<OptionReply> {
    let magic = read_u64(r)?;
    if magic != NBD_REP_MAGIC {
        return Err(invalid(format!("bad option reply magic {magic:#x}")));
    }
    let option = read_u32(r)?;
    let reply_type = read_u32(r)?;
    let len = read_u32(r)?;
    if len > MAX_OPTION_REPLY {
        return Err(invalid(format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data)?;
    Ok(OptionReply {
        option,
        reply_type,
        data,
    })
}

/// A request header (28 bytes, 32 with extended headers; the payload of
/// a write follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    /// 32 bits on the wire without extended headers.
    pub len: u64,
}

impl Request {
    pub const SIZE: usize = 28;
    pub const EXTENDED_SIZE: usize = 32;

    /// The header as sent: compact (`len` must fit 32 bits) or extended.
    pub fn encode(&self, extended: bool) -> io::Result<Vec<u8>> {
        let mut b = Vec::with_capacity(Self::EXTENDED_SIZE);
        let magic = if extended {
            NBD_EXTENDED_REQUEST_MAGIC
        } else {
            NBD_REQUEST_MAGIC
        };
        b.extend_from_slice(&magic.to_be_bytes());
        b.extend_from_slice(&self.flags.to_be_bytes());
        b.extend_from_slice(&self.cmd.to_be_bytes());
        b.extend_from_slice(&self.cookie.to_be_bytes());
        b.extend_from_slice(&self.offset.to_be_bytes());
        if extended {
            b.extend_from_slice(&self.len.to_be_bytes());
        } else {
            let len = u32::try_from(self.len).map_err(|_| {
                invalid(format!(
                    "a request of {} bytes needs extended headers",
                    self.len
                ))
            })?;
            b.extend_from_slice(&len.to_be_bytes());
        }
        Ok(b)
    }

    /// For the test servers: decode a header (28 or 32 bytes, by magic).
    pub fn decode(b: &[u8]) -> io::Result<Request> {
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let be16 = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let be64 = |i: usize| (u64::from(be32(i)) << 32) | u64::from(be32(i + 4));
        if b.len() < Self::SIZE {
            return Err(invalid("short request".into()));
        }
        let len = match be32(0) {
            NBD_REQUEST_MAGIC if b.len() == Self::SIZE => u64::from(be32(24)),
            NBD_EXTENDED_REQUEST_MAGIC if b.len() == Self::EXTENDED_SIZE => be64(24),
            _ => return Err(invalid("bad request magic".into())),
        };
        Ok(Request {
            flags: be16(4),
            cmd: be16(6),
            cookie: be64(8),
            offset: be64(16),
            len,
        })
    }
}

/// The start of a reply: a simple reply or a structured (or extended)
/// reply chunk (its payload, if any, still unread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple {
        error: u32,
        cookie: u64,
    },
    Chunk {
        flags: u16,
        chunk_type: u16,
        cookie: u64,
        len: u64,
    },
}

impl ReplyHeader {
    pub fn cookie(&self) -> u64 {
        match *self {
            ReplyHeader::Simple { cookie, .. } | ReplyHeader::Chunk { cookie, .. } => cookie,
        }
    }
}

/// Read a reply header (16 bytes simple, 20 structured; 32 extended, the
/// only kind a server may send once extended headers are negotiated).
pub fn read_reply_header(r: &mut impl Read, extended: bool) -> io::Result<ReplyHeader> {
    let magic = read_u32(r)?;
    match magic {
        NBD_SIMPLE_REPLY_MAGIC if !extended => {
            let error = read_u32(r)?;
            let cookie = read_u64(r)?;
            Ok(ReplyHeader::Simple { error, cookie })
        }
        NBD_STRUCTURED_REPLY_MAGIC if !extended => {
            let flags = read_u16(r)?;
            let chunk_type = read_u16(r)?;
            let cookie = read_u64(r)?;
            let len = u64::from(read_u32(r)?);
            Ok(ReplyHeader::Chunk {
                flags,
                chunk_type,
                cookie,
                len,
            })
        }
        NBD_EXTENDED_REPLY_MAGIC if extended => {
            let flags = read_u16(r)?;
            let chunk_type = read_u16(r)?;
            let cookie = read_u64(r)?;
            let _offset = read_u64(r)?;
            let len = read_u64(r)?;
            Ok(ReplyHeader::Chunk {
                flags,
                chunk_type,
                cookie,
                len,
            })
        }
        NBD_SIMPLE_REPLY_MAGIC | NBD_STRUCTURED_REPLY_MAGIC => Err(invalid(format!(
            "a reply without extended headers ({magic:#x}) after they were negotiated"
        ))),
        NBD_EXTENDED_REPLY_MAGIC => Err(invalid(
            "an extended reply without extended headers negotiated".into(),
        )),
        m => Err(invalid(format!("bad reply magic {m:#x}"))),
    }
}

/// Encode a simple reply header (for the test servers).
pub fn encode_simple_reply(error: u32, cookie: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v
}

/// Encode a structured reply chunk (for the test servers).
pub fn encode_chunk(flags: u16, chunk_type: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + payload.len());
    v.extend_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&chunk_type.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    v.extend_from_slice(payload);
    v
}

/// Encode an extended reply chunk (for the test servers).
pub fn encode_ext_chunk(
    flags: u16,
    chunk_type: u16,
    cookie: u64,
    offset: u64,
    payload: &[u8],
) -> Vec<u8> {
    let mut v = Vec::with_capacity(32 + payload.len());
    v.extend_from_slice(&NBD_EXTENDED_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&chunk_type.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// Decode the payload of an error chunk: (error, message).
pub fn decode_error_chunk(p: &[u8]) -> io::Result<(u32, String)> {
    if p.len() < 6 {
        return Err(invalid("error chunk shorter than 6 bytes".into()));
    }
    let error = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
    let mlen = usize::from(u16::from_be_bytes([p[4], p[5]]));
    let msg = p
        .get(6..6 + mlen)
        .ok_or_else(|| invalid("error chunk message longer than the chunk".into()))?;
    Ok((error, String::from_utf8_lossy(msg).into_owned()))
}

/// Decode the payload of a block status chunk: the context id and the
/// (length, flags) descriptors.
pub fn decode_block_status(p: &[u8]) -> io::Result<(u32, Vec<(u64, u32)>)> {
    if p.len() < 12 || !(p.len() - 4).is_multiple_of(8) {
        return Err(invalid(format!("block status chunk of {} bytes", p.len())));
    }
    let id = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
    let descs = p[4..]
        .chunks_exact(8)
        .map(|c| {
            (
                u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])),
                u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
            )
        })
        .collect();
    Ok((id, descs))
}

/// Decode the payload of an extended block status chunk
/// (`NBD_REPLY_TYPE_BLOCK_STATUS_EXT`: id, count, then 64-bit length and
/// flags per descriptor). The flags of `base:allocation` are 32 bits; the
/// upper half is dropped.
pub fn decode_block_status_ext(p: &[u8]) -> io::Result<(u32, Vec<(u64, u32)>)> {
    let bad = || invalid(format!("extended block status chunk of {} bytes", p.len()));
    if p.len() < 24 || !(p.len() - 8).is_multiple_of(16) {
        return Err(bad());
    }
    let be32 = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    let id = be32(0);
    if usize::try_from(be32(4)).ok() != Some((p.len() - 8) / 16) {
        return Err(bad());
    }
    let descs = p[8..]
        .chunks_exact(16)
        .map(|c| {
            let mut l = [0u8; 8];
            l.copy_from_slice(&c[..8]);
            (
                u64::from_be_bytes(l),
                u32::from_be_bytes([c[12], c[13], c[14], c[15]]),
            )
        })
        .collect();
    Ok((id, descs))
}

/// Write all of `parts` (one message) to `w`.
pub fn write_all_parts(w: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    for p in parts {
        w.write_all(p)?;
    }
    w.flush()
}

pub fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request {
            flags: NBD_CMD_FLAG_FUA,
            cmd: NBD_CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            len: 4096,
        };
        let b = r.encode(false).unwrap();
        assert_eq!(b.len(), Request::SIZE);
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&b[6..8], &[0, 1]);
        assert_eq!(Request::decode(&b).unwrap(), r);
        let long = Request { len: 1 << 40, ..r };
        assert!(long.encode(false).is_err(), "64-bit length, compact header");
        let b = long.encode(true).unwrap();
        assert_eq!(b.len(), Request::EXTENDED_SIZE);
        assert_eq!(&b[0..4], &[0x21, 0xe4, 0x1c, 0x71]);
        assert_eq!(Request::decode(&b).unwrap(), long);
    }

    #[test]
    fn option_encoding() {
        let v = encode_option(NBD_OPT_GO, &go_data("ex", &[NBD_INFO_BLOCK_SIZE]));
        assert_eq!(&v[0..8], b"IHAVEOPT");
        assert_eq!(&v[8..12], &7u32.to_be_bytes());
        assert_eq!(&v[12..16], &10u32.to_be_bytes());
        assert_eq!(&v[16..], &[0, 0, 0, 2, b'e', b'x', 0, 1, 0, 3]);
        let m = meta_context_data("", &[BASE_ALLOCATION]);
        assert_eq!(m.len(), 4 + 4 + 4 + 15);
        assert_eq!(&m[12..], BASE_ALLOCATION.as_bytes());
    }

    #[test]
    fn replies_decode() {
        let mut v = encode_simple_reply(NBD_EIO, 9);
        v.extend(encode_chunk(
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_BLOCK_STATUS,
            10,
            &[0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 3],
        ));
        let mut r = &v[..];
        assert_eq!(
            read_reply_header(&mut r, false).unwrap(),
            ReplyHeader::Simple {
                error: NBD_EIO,
                cookie: 9
            }
        );
        let h = read_reply_header(&mut r, false).unwrap();
        let ReplyHeader::Chunk { len, cookie, .. } = h else {
            panic!("{h:?}")
        };
        assert_eq!((len, cookie), (12, 10));
        let (id, d) = decode_block_status(r).unwrap();
        assert_eq!((id, d), (1, vec![(512, NBD_STATE_HOLE | NBD_STATE_ZERO)]));
        assert!(decode_block_status(&[0; 8]).is_err());
        let (e, m) = decode_error_chunk(&[0, 0, 0, 5, 0, 2, b'n', b'o']).unwrap();
        assert_eq!((e, m.as_str()), (NBD_EIO, "no"));
        assert!(decode_error_chunk(&[0, 0, 0, 5, 0, 9, b'n']).is_err());
        let bad = [0u8; 16];
        assert!(read_reply_header(&mut &bad[..], false).is_err());
    }

    #[test]
    fn extended_replies_decode() {
        let mut p = 7u32.to_be_bytes().to_vec();
        p.extend(1u32.to_be_bytes());
        p.extend((5u64 << 32).to_be_bytes());
        p.extend(u64::from(NBD_STATE_HOLE).to_be_bytes());
        let v = encode_ext_chunk(
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_BLOCK_STATUS_EXT,
            3,
            0,
            &p,
        );
        let mut r = &v[..];
        assert!(
            read_reply_header(&mut &v[..], false).is_err(),
            "extended reply without extended headers"
        );
        let h = read_reply_header(&mut r, true).unwrap();
        assert_eq!(
            h,
            ReplyHeader::Chunk {
                flags: NBD_REPLY_FLAG_DONE,
                chunk_type: NBD_REPLY_TYPE_BLOCK_STATUS_EXT,
                cookie: 3,
                len: 24
            }
        );
        assert_eq!(
            decode_block_status_ext(r).unwrap(),
            (7, vec![(5 << 32, NBD_STATE_HOLE)])
        );
        let mut wrong = p.clone();
        wrong[7] = 2;
        assert!(
            decode_block_status_ext(&wrong).is_err(),
            "count and size differ"
        );
        assert!(decode_block_status_ext(&p[..20]).is_err());
        let simple = encode_simple_reply(0, 1);
        assert!(read_reply_header(&mut &simple[..], true).is_err());
    }

    #[test]
    fn option_reply_limits() {
        let mut v = NBD_REP_MAGIC.to_be_bytes().to_vec();
        v.extend(NBD_OPT_GO.to_be_bytes());
        v.extend(NBD_REP_ERR_UNKNOWN.to_be_bytes());
        v.extend(3u32.to_be_bytes());
        v.extend(b"why");
        let r = read_option_reply(&mut &v[..]).unwrap();
        assert_eq!(r.reply_type, NBD_REP_ERR_UNKNOWN);
        assert_eq!(r.message(), "why");
        v[16..20].copy_from_slice(&(MAX_OPTION_REPLY + 1).to_be_bytes());
        assert!(read_option_reply(&mut &v[..]).is_err());
    }
}
