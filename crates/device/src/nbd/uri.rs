//! NBD URIs (the NBD project's doc/uri.md): `nbd://HOST[:PORT][/EXPORT]`
//! and `nbd+unix:///EXPORT?socket=PATH`. TLS (`nbds`) is not supported.

use std::path::PathBuf;

/// The default NBD port (IANA).
pub const NBD_PORT: u16 = 10809;

/// Where an export is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A TCP host (name, IPv4, or IPv6 without brackets) and port.
    Tcp { host: String, port: u16 },
    /// A unix socket.
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    /// The export name ("" is the server's default export).
    pub export: String,
}

/// Does `s` look like a device URI (`nbd://`, `nbd+unix://`, `nbds://`,
/// ...)? Such a string is never taken for a path.
pub fn is_uri(s: &str) -> bool {
    match s.split_once("://") {
        Some((scheme, _)) => {
            scheme.starts_with("nbd")
                && scheme
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'+')
        }
        None => false,
    }
}

impl NbdUri {
    /// Parse `s`; the error says what is wrong, in a few words.
    pub fn parse(s: &str) -> Result<NbdUri, String> {
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            "not an NBD URI (nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)"
                .to_string()
        })?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        if path.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err("fragments (#...) are not supported".into());
        }
        let export = decode(path)?;
        let mut socket = None;
        for kv in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|kv| !kv.is_empty())
        {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "socket" => socket = Some(decode(v)?),
                "tls-certificates" | "tls-psk-file" | "tls-hostname" | "tls-username" => {
                    return Err("TLS is not supported".into());
                }
                _ => return Err(format!("unknown URI parameter '{k}'")),
            }
        }
        match scheme {
            "nbd" | "nbd+tcp" => {
                if socket.is_some() {
                    return Err("socket= is for nbd+unix:// URIs".into());
                }
                let (host, port) = split_host_port(authority)?;
                Ok(NbdUri {
                    address: Address::Tcp { host, port },
                    export,
                })
            }
            "nbd+unix" => {
                if !authority.is_empty() {
                    return Err(
                        "an nbd+unix:// URI has no host (nbd+unix:///EXPORT?socket=PATH)".into(),
                    );
                }
                let Some(sock) = socket.filter(|s| !s.is_empty()) else {
                    return Err("missing ?socket=PATH".into());
                };
                Ok(NbdUri {
                    address: Address::Unix(PathBuf::from(sock)),
                    export,
                })
            }
            "nbds" | "nbds+unix" | "nbds+tcp" => Err("TLS (nbds://) is not supported".into()),
            other => Err(format!(
                "unsupported scheme '{other}://' (nbd:// or nbd+unix://)"
            )),
        }
    }
}

impl NbdUri {
    /// A key naming the export itself, equal for two URIs that reach the
    /// same export (a unix socket by its inode, so two spellings of its
    /// path agree): for refusing the same export twice in one run.
    /// `None` when a unix socket cannot be stat'ed.
    pub fn identity(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        match &self.address {
            Address::Tcp { host, port } => Some(format!(
                "tcp:{}:{port}/{}",
                host.to_ascii_lowercase(),
                self.export
            )),
            Address::Unix(p) => {
                let m = std::fs::metadata(p).ok()?;
                Some(format!("unix:{}:{}/{}", m.dev(), m.ino(), self.export))
            }
        }
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.address {
            Address::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{}", self.export)
            }
            Address::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            Address::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

fn split_host_port(a: &str) -> Result<(String, u16), String> {
    let a = a.rsplit_once('@').map_or(a, |(_, h)| h);
    let (host, port) = if let Some(r) = a.strip_prefix('[') {
        let (h, after) = r.split_once(']').ok_or("unterminated '[' in the host")?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(p.strip_prefix(':').ok_or("junk after ']' in the host")?),
            ),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let host = decode(host)?;
    if host.is_empty() {
        return Err("missing host (nbd://HOST[:PORT]/EXPORT)".into());
    }
    let port = match port {
        None | Some("") => NBD_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("bad port '{p}'"))?,
    };
    Ok((host, port))
}

/// Percent-decoding.
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{s}' is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(h: &str, p: u16, e: &str) -> NbdUri {
        NbdUri {
            address: Address::Tcp {
                host: h.into(),
                port: p,
            },
            export: e.into(),
        }
    }

    #[test]
    fn good_uris() {
        assert_eq!(
            NbdUri::parse("nbd://localhost").unwrap(),
            tcp("localhost", 10809, "")
        );
        assert_eq!(
            NbdUri::parse("nbd://h:1234/ex").unwrap(),
            tcp("h", 1234, "ex")
        );
        assert_eq!(
            NbdUri::parse("nbd://h/a/b%20c").unwrap(),
            tcp("h", 10809, "a/b c")
        );
        assert_eq!(
            NbdUri::parse("nbd://[::1]:99/x").unwrap(),
            tcp("::1", 99, "x")
        );
        assert_eq!(
            NbdUri::parse("nbd+unix:///disk?socket=/tmp/s.sock").unwrap(),
            NbdUri {
                address: Address::Unix("/tmp/s.sock".into()),
                export: "disk".into()
            }
        );
        assert_eq!(NbdUri::parse("nbd+unix://?socket=/s").unwrap().export, "");
        let u = NbdUri::parse("nbd://[::1]:99/x").unwrap();
        assert_eq!(u.to_string(), "nbd://[::1]:99/x");
    }

    #[test]
    fn bad_uris() {
        for (s, want) in [
            ("nbd://", "missing host"),
            ("nbd://h:0/x", "bad port"),
            ("nbd://h:99999/x", "bad port"),
            ("nbd://h:x/x", "bad port"),
            ("nbd+unix:///x", "missing ?socket"),
            ("nbd+unix://h/x?socket=/s", "no host"),
            ("nbds://h/x", "TLS"),
            ("nbd+vsock://1/x", "unsupported scheme"),
            ("nbd://h/x?foo=1", "unknown URI parameter"),
            ("nbd://h/%zz", "percent-escape"),
            ("nbd://h/x?socket=/s", "socket= is for"),
        ] {
            let e = NbdUri::parse(s).expect_err(s);
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn uri_detection() {
        assert!(is_uri("nbd://h/x"));
        assert!(is_uri("nbd+unix:///x?socket=/s"));
        assert!(is_uri("nbds://h"));
        assert!(!is_uri("/tmp/nbd://x"));
        assert!(!is_uri("img.raw"));
        assert!(!is_uri("nbd.img"));
    }
}
