//! Online lazy init of an image through an open read-write `Filesystem`,
//! for `scripts/bench-lazyinit.sh` (section 5) until `ext4kit mount` runs
//! the worker itself.
//!
//! ```text
//! cargo run --release -p ext4kit --example online_lazyinit -- IMAGE [MULT|adaptive]
//! ```
//!
//! Opens IMAGE (exclusive), starts the worker at `init_itable=MULT`
//! (default 10; 0 is full speed) or adaptive pacing, waits for it, closes
//! the filesystem cleanly (the flags are committed) and prints one JSON
//! line: wall seconds from before the open to after the close, and the
//! worker's status.

use std::error::Error;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use ext4kit::lazyinit::online::{self, OnlineOptions, OnlineState};
use ext4kit::lazyinit::{Pace, VerifyZero};
use ext4kit_device::{FileDevice, OpenOptions};
use ext4kit_fs::fs::Filesystem;
use ext4kit_fs::rw::RwOptions;

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: online_lazyinit IMAGE [MULT|adaptive]".into());
    };
    let pace = match args.get(1).map(String::as_str) {
        None => Pace::default(),
        Some("adaptive") => Pace::Adaptive {
            max_mult: 100,
            fallback_mult: 10,
        },
        Some(m) => Pace::Fixed {
            mult: m
                .parse()
                .map_err(|_| format!("'{m}': expected a multiplier or 'adaptive'"))?,
        },
    };
    let t0 = Instant::now();
    let dev = FileDevice::open(
        path,
        OpenOptions {
            write: true,
            exclusive: true,
        },
    )?;
    let fs = Arc::new(Filesystem::open(Arc::new(dev), RwOptions::default())?);
    let opened = t0.elapsed();
    let h = online::start(
        fs.clone(),
        OnlineOptions::for_path(path, pace, VerifyZero::Auto),
    )?;
    let st = h.wait();
    drop(h);
    let t_close = Instant::now();
    Arc::try_unwrap(fs)
        .map_err(|_| "filesystem still shared")?
        .close()?;
    let closed = t_close.elapsed();
    let line = format!(
        "{{\"secs\": {:.3}, \"open_secs\": {:.3}, \"close_secs\": {:.3}, \"state\": \"{}\", \"groups_done\": {}, \"groups_total\": {}, \"groups_zeroed_now\": {}, \"work_secs\": {:.3}, \"slept_secs\": {:.3}, \"worker_secs\": {:.3}, \"bytes_zeroed\": {}, \"bytes_skipped_already_zero\": {}, \"pace\": \"{}\"}}",
        t0.elapsed().as_secs_f64(),
        opened.as_secs_f64(),
        closed.as_secs_f64(),
        st.state,
        st.groups_done,
        st.groups_total,
        st.groups_zeroed_now,
        st.work_secs,
        st.slept_secs,
        st.elapsed_secs,
        st.bytes_zeroed,
        st.bytes_skipped_already_zero,
        st.pace
    );
    // A closed stdout must not turn a finished run into a failure.
    let _ = writeln!(std::io::stdout().lock(), "{line}");
    if st.state != OnlineState::Done {
        return Err(format!("{path}: {st}").into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("online_lazyinit: {e}");
            ExitCode::FAILURE
        }
    }
}
