//! Time as certrotor prints and parses it: durations (`30d`, `8760h`, `-2d`), RFC 3339
//! timestamps, and kubeadm's `check-expiration` formats.
//!
//! Nothing here reads the clock except [`SystemClock`]; everything else takes Unix seconds. The
//! library never reads the date itself: it asks the [`Clock`] it was handed by the edge (the
//! binary passes a [`SystemClock`]), so tests can pin any instant with a [`ManualClock`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds in a day.
pub const DAY: i64 = 86_400;
/// A year as kubeadm counts one (365 days).
pub const YEAR: i64 = 365 * DAY;

/// Where the library gets the current date: Unix seconds. Durations and deadlines are measured
/// with [`std::time::Instant`], not with this.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time as Unix seconds.
    fn now(&self) -> i64;
}

/// A clock shared by the options that travel down from the edge.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock: the only reader of the date in certrotor.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// The system clock as a [`SharedClock`].
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        }
    }
}

/// A clock that says what it was set to: tests pin an instant, then [`set`](Self::set) or
/// [`advance`](Self::advance) it.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `now` (Unix seconds).
    pub fn at(now: i64) -> ManualClock {
        ManualClock(AtomicI64::new(now))
    }

    /// Moves the clock to `now`.
    pub fn set(&self, now: i64) {
        self.0.store(now, Ordering::SeqCst);
    }

    /// Moves the clock `secs` seconds forward (backward when negative).
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Parses a duration such as `30d`, `8760h`, `1y`, `1d12h`, `90m`, `45s` or `-2d` into seconds.
/// Units: `y` (365 days), `w`, `d`, `h`, `m`, `s`. A bare number is refused, to avoid guessing.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let usage = || {
        format!(
            "invalid duration '{text}': use a number with a unit, e.g. 30d, 12h, 1y, 1d12h or -2d"
        )
    };
    let (negative, body) = match text.trim().strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.trim().strip_prefix('+').unwrap_or(text.trim())),
    };
    if body.is_empty() {
        return Err(usage());
    }
    let mut total: i64 = 0;
    let mut digits = String::new();
    for c in body.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'y' => YEAR,
            'w' => 7 * DAY,
            'd' => DAY,
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(usage()),
        };
        let n: i64 = digits.parse().map_err(|_| usage())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(usage)?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(usage());
    }
    Ok(if negative { -total } else { total })
}

/// Formats seconds as the shortest exact duration in `d`/`h`/`m`/`s` (`365d`, `1d12h`).
pub fn format_duration(secs: i64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    let sign = if secs < 0 { "-" } else { "" };
    let mut rest = secs.unsigned_abs();
    let mut out = String::from(sign);
    for (unit, label) in [(86_400u64, 'd'), (3600, 'h'), (60, 'm'), (1, 's')] {
        if rest >= unit {
            out.push_str(&format!("{}{}", rest / unit, label));
            rest %= unit;
        }
    }
    out
}

/// Unix seconds as der's calendar time. der covers 1970-01-01 to 9999-12-31, the range of
/// X.509 times it decodes; a value outside it (only reachable by arithmetic on such times) is
/// shown at the nearest end of the range.
fn date_time(secs: i64) -> der::DateTime {
    let max = der::DateTime::INFINITY.unix_duration().as_secs();
    let clamped = u64::try_from(secs).unwrap_or(0).min(max);
    der::DateTime::from_unix_duration(std::time::Duration::from_secs(clamped))
        .unwrap_or(der::DateTime::INFINITY)
}

/// Splits Unix seconds into (year, month, day, hour, minute, second) in UTC.
pub fn civil(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let t = date_time(secs);
    (
        i64::from(t.year()),
        u32::from(t.month()),
        u32::from(t.day()),
        u32::from(t.hour()),
        u32::from(t.minutes()),
        u32::from(t.seconds()),
    )
}

/// RFC 3339 in UTC with a `Z`, e.g. `2026-11-22T14:13:34Z` (der's `DateTime` format).
pub fn rfc3339(secs: i64) -> String {
    date_time(secs).to_string()
}

/// A compact UTC stamp for backup ids, e.g. `20261122T141334Z`.
pub fn compact_stamp(secs: i64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// Parses an RFC 3339 UTC time (`2026-11-22T14:13:34Z`) into Unix seconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let t: der::DateTime = text.parse().ok()?;
    i64::try_from(t.unix_duration().as_secs()).ok()
}

/// kubeadm's EXPIRES column: Go layout `Jan 02, 2006 15:04 MST` in UTC.
pub fn kubeadm_date(secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, _) = civil(secs);
    let month = MONTHS.get(mo as usize - 1).copied().unwrap_or("???");
    format!("{month} {d:02}, {y} {h:02}:{mi:02} UTC")
}

/// kubeadm's RESIDUAL TIME column (apimachinery `HumanDuration`, kubeadm >= 1.31).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return two_units(minutes, "m", secs % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        return two_units(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return two_units(hours / 24, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return two_units(hours / 24 / 365, "y", (hours / 24) % 365, "d");
    }
    format!("{}y", hours / 24 / 365)
}

/// `{big}{big_unit}{small}{small_unit}`, without the small part when it is 0 (`3h`, `3h20m`).
fn two_units(big: i64, big_unit: &str, small: i64, small_unit: &str) -> String {
    if small == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit}{small}{small_unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_says_what_it_was_set_to() {
        let clock = ManualClock::at(1_795_356_814);
        assert_eq!(clock.now(), 1_795_356_814);
        clock.advance(DAY);
        assert_eq!(clock.now(), 1_795_356_814 + DAY);
        clock.set(0);
        assert_eq!(clock.now(), 0);
        assert!(
            SystemClock.now() > 1_700_000_000,
            "the system clock reads the date"
        );
    }

    #[test]
    fn durations_parse() {
        for (text, want) in [
            ("30d", 30 * DAY),
            ("8760h", YEAR),
            ("1y", YEAR),
            ("1d12h", DAY + 12 * 3600),
            ("-2d", -2 * DAY),
            ("90m", 5400),
            ("45s", 45),
            ("2w", 14 * DAY),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "30", "d", "3x", "-", "1d2", "99999999999999999999y"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_format_and_parse() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_356_814), "2026-11-22T14:13:34Z");
        assert_eq!(parse_rfc3339("2026-11-22T14:13:34Z"), Some(1_795_356_814));
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(951_782_400));
        assert_eq!(parse_rfc3339("2026-13-22T14:13:34Z"), None);
        assert_eq!(parse_rfc3339("2026-02-30T14:13:34Z"), None);
        assert_eq!(parse_rfc3339("2026-11-22 14:13:34Z"), None);
        assert_eq!(rfc3339(-1), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(kubeadm_date(1_795_356_814), "Nov 22, 2026 14:13 UTC");
        assert_eq!(compact_stamp(1_795_356_814), "20261122T141334Z");
        for s in [0, 951_782_400, 1_795_356_814, 2_556_143_999, 4_102_444_800] {
            assert_eq!(parse_rfc3339(&rfc3339(s)), Some(s));
        }
    }

    #[test]
    fn residual_time_matches_kubeadm() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (59, "59s"),
            (150, "2m30s"),
            (3000, "50m"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (3 * DAY + 3 * 3600, "3d3h"),
            (364 * DAY, "364d"),
            (2 * YEAR + 327 * DAY, "2y327d"),
            (10 * YEAR, "10y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
        assert_eq!(format_duration(YEAR), "365d");
        assert_eq!(format_duration(-(DAY + 3600)), "-1d1h");
    }
}
