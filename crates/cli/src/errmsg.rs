//! The one line `ext4kit: …` that a failed command prints.

/// `e` and its causes joined with ": ", on one line, without repeating
/// what an outer message already said. A library error that shows its
/// source in its own message *and* returns it from `source()` would
/// otherwise be printed twice by a chain printer (anyhow's `{:#}`):
/// "… (os error 2): No such file or directory (os error 2)".
pub fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if msg.contains(&s) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&s);
    }
    // A path with a newline in it must not split the line.
    msg.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;
    use std::io;

    /// Shows its source and returns it too.
    #[derive(Debug)]
    struct Both(io::Error);
    impl std::fmt::Display for Both {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "opening x.conf: {}", self.0)
        }
    }
    impl std::error::Error for Both {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn causes_are_said_once() {
        let r: Result<(), Both> = Err(Both(io::Error::from_raw_os_error(libc::EIO)));
        let e = r.context("reading mke2fs.conf").unwrap_err();
        let m = one_line(&e);
        assert_eq!(m.matches("os error 5").count(), 1, "{m}");
        assert!(
            m.starts_with("reading mke2fs.conf: opening x.conf: "),
            "{m}"
        );
    }

    #[test]
    fn plain_chains_are_joined() {
        let r: Result<(), io::Error> = Err(io::Error::other("bad\nthing"));
        let e = r.context("step").unwrap_err();
        assert_eq!(one_line(&e), "step: bad thing");
    }
}
