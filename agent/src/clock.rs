//! Time as certrotor prints and parses it: durations (`30d`, `8760h`, `-2d`), RFC 3339
//! timestamps, and kubeadm's `check-expiration` formats.
//!
//! Nothing here reads the clock except [`now`]; everything else takes Unix seconds, so policy code
//! can be tested at any instant.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds in a day.
pub const DAY: i64 = 86_400;
/// A year as kubeadm counts one (365 days).
pub const YEAR: i64 = 365 * DAY;

/// The current time as Unix seconds.
pub fn now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
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

/// Splits Unix seconds into (year, month, day, hour, minute, second) in UTC.
pub fn civil(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = secs.div_euclid(DAY);
    let rem = secs.rem_euclid(DAY);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        ((rem % 3600) / 60) as u32,
        (rem % 60) as u32,
    )
}

/// RFC 3339 in UTC with a `Z`, e.g. `2026-11-22T14:13:34Z`.
pub fn rfc3339(secs: i64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// A compact UTC stamp for backup ids, e.g. `20261122T141334Z`.
pub fn compact_stamp(secs: i64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// Parses an RFC 3339 UTC time (`2026-11-22T14:13:34Z`) into Unix seconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Inverse of `civil` (days-from-civil).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2.rem_euclid(400);
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * DAY + h * 3600 + mi * 60 + s)
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
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{}h", hours / 24, h)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{}d", hours / 24 / 365, dy)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

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
