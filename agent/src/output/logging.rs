//! Diagnostics: one line per decision on stderr, through the `log` facade.
//!
//! The library logs with `log::error!` … `log::trace!`; the binary installs [`init`] once with
//! the level and format from `--log-level` / `--log-format`. Two formats:
//! - `text`: `2026-11-23T00:45:54.123Z INFO  [ops] pass done: …`, UTC, millisecond precision;
//! - `json`: one JSON object per line (`time`, `level`, `target`, `msg`) for log shippers.
//!
//! A write error (a closed pipe, a full disk behind a redirection) is ignored: losing a log line
//! must never stop the daemon. This is why certrotor implements `log::Log` itself instead of
//! using `simple_logger`, whose `eprintln!` panics on such an error (and `panic = "abort"` would
//! end the process); see ARCHITECTURE.md. Never log key material. Dependencies (ureq,
//! ureq-proto, rustls) are heard at debug at most ([`DEPENDENCY_MAX`]): their trace lines carry
//! HTTP bodies, which can hold a private key (issue 30.1).

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Human-readable: timestamp, level, module, message.
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown log format '{other}': use text or json")),
        }
    }
}

/// Parses a `--log-level` value: off, error, warn, info, debug or trace.
pub fn parse_level(s: &str) -> Result<LevelFilter, String> {
    s.parse::<LevelFilter>()
        .map_err(|_| format!("unknown log level '{s}': use off, error, warn, info, debug or trace"))
}

static FORMAT: AtomicU8 = AtomicU8::new(0);
static LOGGER: StderrLogger = StderrLogger;

struct StderrLogger;

/// Installs the stderr logger with `level` and `format`. A second call only changes the level
/// and format.
pub fn init(level: LevelFilter, format: Format) {
    FORMAT.store(
        match format {
            Format::Text => 0,
            Format::Json => 1,
        },
        Ordering::Relaxed,
    );
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

/// Modules split out of one file (issue 28) and the tag of the file they came from: a split moves
/// code, and leaves the log lines as they were.
const SPLIT_FROM: [(&str, &str); 15] = [
    ("cluster::client", "cluster"),
    ("cluster::discover", "cluster"),
    ("cluster::gates", "cluster"),
    ("cluster::lock", "cluster"),
    ("cluster::published_pair", "cluster"),
    ("cluster::session", "cluster"),
    ("pass::leaders_last", "run"),
    ("pass::live_reload", "run"),
    ("pass::pods", "run"),
    ("pass::rollback", "run"),
    ("pass::run_report", "run"),
    ("restart::platform", "restart"),
    ("restart::serving", "restart"),
    ("restart::stop", "restart"),
    ("restart::target", "restart"),
];

/// The module path without the crate name: `certrotor::pass::ops` → `ops`.
fn short_target(target: &str) -> &str {
    // The module's own name (`certrotor::pass::ops` -> `ops`), not its folder: short, and the
    // same whichever folder the module lives in. Other crates' targets are kept whole.
    match target.strip_prefix("certrotor::") {
        Some(path) => match SPLIT_FROM.iter().find(|(module, _)| *module == path) {
            Some((_, tag)) => tag,
            None => path.rsplit("::").next().unwrap_or(path),
        },
        None => target,
    }
}

/// The current time as RFC 3339 UTC with milliseconds.
fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let (y, mo, d, h, mi, s) = crate::sys::clock::civil(secs);
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z",
        now.subsec_millis()
    )
}

pub use crate::sys::text::{escape_controls, escape_controls_json};

/// One formatted line, with its newline.
pub fn format_line(format: Format, time: &str, level: Level, target: &str, msg: &str) -> String {
    let target = short_target(target);
    match format {
        Format::Text => {
            // One record is one line: a message with newlines keeps them escaped, and no
            // control character is written raw.
            let msg = escape_controls(msg).replace('\n', "\\n");
            format!("{time} {level:<5} [{target}] {msg}\n")
        }
        Format::Json => {
            #[derive(serde::Serialize)]
            struct Line<'a> {
                time: &'a str,
                level: &'a str,
                target: &'a str,
                msg: &'a str,
            }
            let level = level.as_str().to_ascii_lowercase();
            let line = Line {
                time,
                level: &level,
                target,
                msg,
            };
            // Serializing four strings cannot fail; fall back to the text form if it ever did.
            match serde_json::to_string(&line) {
                Ok(json) => format!("{}\n", escape_controls_json(&json)),
                Err(_) => format!("{time} {level} [{target}] {}\n", msg.replace('\n', "\\n")),
            }
        }
    }
}

/// The most a dependency (anything but certrotor and its bottlerocket crate) may log: debug.
/// Below it, ureq-proto prints every HTTP body it reads or writes as hex and ASCII rows (the
/// apiserver-etcd-client pair published through etcd, private key included, at `--log-level
/// trace`); rustls' trace lines describe handshake bytes. No such line ever reaches the output.
pub const DEPENDENCY_MAX: Level = Level::Debug;

/// Whether a line of `level` from `target` may be written (below the `--log-level`).
pub fn passes(level: Level, target: &str) -> bool {
    let own = ["certrotor", "bottlerocket"].iter().any(|c| {
        target == *c
            || target
                .strip_prefix(c)
                .is_some_and(|rest| rest.starts_with("::"))
    });
    level <= log::max_level() && (own || level <= DEPENDENCY_MAX)
}

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        passes(metadata.level(), metadata.target())
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let format = if FORMAT.load(Ordering::Relaxed) == 1 {
            Format::Json
        } else {
            Format::Text
        };
        let line = format_line(
            format,
            &timestamp(),
            record.level(),
            record.target(),
            &record.args().to_string(),
        );
        // One write per line, so that lines from several threads do not interleave; errors
        // (EPIPE, EBADF, ENOSPC) are dropped on purpose.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_json_lines() {
        let t = format_line(
            Format::Text,
            "2026-11-23T00:00:00.000Z",
            Level::Warn,
            "certrotor::pass::ops",
            "a\nb",
        );
        assert_eq!(t, "2026-11-23T00:00:00.000Z WARN  [ops] a\\nb\n");
        let j = format_line(
            Format::Json,
            "2026-11-23T00:00:00.000Z",
            Level::Info,
            "certrotor::pass::ops",
            "say \"hi\"\n",
        );
        let v: serde_json::Value = serde_json::from_str(j.trim_end()).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["target"], "ops");
        assert_eq!(v["msg"], "say \"hi\"\n");
        assert_eq!(j.matches('\n').count(), 1);
    }

    /// A module split out of a file logs under that file's tag; every other module under its
    /// own name, whatever its folder; other crates under their whole path.
    #[test]
    fn split_modules_keep_their_files_tag() {
        for (target, tag) in [
            ("certrotor::cluster::session", "cluster"),
            ("certrotor::restart::stop", "restart"),
            ("certrotor::pass::rollback", "run"),
            ("certrotor::cluster", "cluster"),
            ("certrotor::cluster::roles", "roles"),
            ("certrotor::txn::lock", "lock"),
            ("certrotor::pass::ops", "ops"),
            ("ureq::run", "ureq::run"),
        ] {
            assert_eq!(short_target(target), tag, "{target}");
        }
    }

    /// Issue 30.1: dependencies never log below debug, whatever `--log-level`; certrotor's own
    /// modules (and its bottlerocket crate) do.
    #[test]
    fn dependency_trace_lines_never_pass() {
        log::set_max_level(LevelFilter::Trace);
        for target in [
            "ureq_proto::util",
            "ureq::run",
            "rustls::client::hs",
            "certrotorx",
        ] {
            assert!(!passes(Level::Trace, target), "{target}");
            assert!(passes(Level::Debug, target), "{target}");
        }
        for target in [
            "certrotor",
            "certrotor::ops",
            "certrotor::cli",
            "bottlerocket::client",
        ] {
            assert!(passes(Level::Trace, target), "{target}");
        }
        log::set_max_level(LevelFilter::Info);
        assert!(!passes(Level::Debug, "certrotor::ops"));
        assert!(passes(Level::Info, "ureq::run"));
    }

    /// Issue 30.12: no control character reaches a log line raw, in either format; the JSON
    /// line still holds the same message.
    #[test]
    fn control_characters_are_escaped() {
        let evil = "a\u{1b}[2J\rb\u{9b}31m\u{7f}\u{202e}c\td\ne";
        let t = format_line(Format::Text, "T", Level::Warn, "certrotor::ops", evil);
        assert_eq!(
            t,
            "T WARN  [ops] a\\x1b[2J\\x0db\\u{9b}31m\\x7f\\u{202e}c\td\\ne\n"
        );
        let j = format_line(Format::Json, "T", Level::Warn, "certrotor::ops", evil);
        assert!(
            !j.trim_end()
                .chars()
                .any(|c| c.is_control() || c == '\u{202e}'),
            "{j:?}"
        );
        let v: serde_json::Value = serde_json::from_str(j.trim_end()).unwrap();
        assert_eq!(v["msg"], evil);
        assert_eq!(escape_controls("plain\ttext\n"), "plain\ttext\n");
    }

    #[test]
    fn levels_and_formats_parse() {
        assert_eq!(parse_level("debug"), Ok(LevelFilter::Debug));
        assert_eq!(parse_level("off"), Ok(LevelFilter::Off));
        assert!(parse_level("loud").unwrap_err().contains("use off, error"));
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert!("xml".parse::<Format>().is_err());
    }

    #[test]
    fn timestamp_is_utc_with_millis() {
        let t = timestamp();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[19] == b'.', "{t}");
    }
}
