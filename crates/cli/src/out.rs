//! Standard output that never panics and never aborts the work.
//!
//! `println!` panics when stdout is a closed pipe (`ext4kit info IMG |
//! head -1`). Every report line goes through `outln!` instead: the first
//! failed write (EPIPE or any other error) closes our side, later lines are
//! dropped, and the command finishes what it was doing (a format is never
//! left half-written because nobody reads its report). At exit, [`status`]
//! turns a broken pipe into a quiet exit with 141 (128 + SIGPIPE, what a
//! shell shows for coreutils in the same spot) and any other output error
//! into one line on stderr.

use std::fmt;
use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);
static FIRST_ERROR: Mutex<Option<io::ErrorKind>> = Mutex::new(None);

/// Exit status after a broken pipe on stdout.
pub const EXIT_BROKEN_PIPE: i32 = 141;

/// Write formatted text to stdout; see the module documentation.
pub fn write_fmt(args: fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut so = io::stdout().lock();
    if let Err(e) = so.write_fmt(args).and_then(|()| so.flush()) {
        CLOSED.store(true, Ordering::Relaxed);
        if let Ok(mut first) = FIRST_ERROR.lock() {
            first.get_or_insert(e.kind());
        }
    }
}

/// How output ended: `None` when every line was written, else the exit
/// status to use and, for errors other than a broken pipe, a message.
pub fn status() -> Option<(i32, Option<String>)> {
    let kind = (*FIRST_ERROR.lock().ok()?)?;
    Some(if kind == io::ErrorKind::BrokenPipe {
        (EXIT_BROKEN_PIPE, None)
    } else {
        (1, Some(format!("writing to standard output: {kind}")))
    })
}

/// `println!` for reports: see [`write_fmt`].
macro_rules! outln {
    () => { $crate::out::write_fmt(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::out::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}
