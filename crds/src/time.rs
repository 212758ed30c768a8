//! RFC 3339 timestamps in UTC (`2026-11-30T10:29:27Z`): the one formatter of the workspace,
//! for status fields, annotations, Secret values and messages.
//!
//! Hand-written (a civil date from days since 1970) so that this crate's API does not depend
//! on a date library's types. Times before 1970 are written as the epoch. A fraction of a
//! second, where a variant keeps one, is written without trailing zeros and left out when zero
//! (`…:10.25Z`, `…:10Z`), as Kubernetes and the AWS SDK write it.

use std::time::{Duration, SystemTime};

/// `t` to the second (the fraction is dropped): `2026-11-30T10:29:27Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = since_epoch(t);
    format(d.as_secs(), 0, 0)
}

/// `t` rounded to the nearest millisecond (halves up): `2027-01-15T08:00:10.251Z`.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let millis = (since_epoch(t).as_nanos() + 500_000) / 1_000_000;
    format(
        u64::try_from(millis / 1_000).unwrap_or(u64::MAX),
        (millis % 1_000) as u32,
        3,
    )
}

/// `t` to the microsecond (the rest is dropped): `2027-01-15T08:00:10.250999Z`.
pub fn rfc3339_micros(t: SystemTime) -> String {
    let d = since_epoch(t);
    format(d.as_secs(), d.subsec_micros(), 6)
}

fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// `secs` since the epoch plus `fraction` in units of 10^-`digits` seconds.
fn format(secs: u64, fraction: u32, digits: usize) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil(days as i64);
    let mut out = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    );
    if fraction != 0 {
        out.push('.');
        out.push_str(format!("{fraction:0digits$}").trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn the_epoch() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_micros(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn before_the_epoch_is_the_epoch() {
        let before = UNIX_EPOCH - Duration::from_secs(86_400);
        assert_eq!(rfc3339(before), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn leap_days() {
        assert_eq!(rfc3339(at(951_782_400, 0)), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(1_709_164_799, 0)), "2024-02-28T23:59:59Z");
        assert_eq!(rfc3339(at(1_709_164_800, 0)), "2024-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(1_709_251_200, 0)), "2024-03-01T00:00:00Z");
        // 2100 is not a leap year.
        assert_eq!(rfc3339(at(4_107_542_400, 0)), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn a_known_time() {
        let t = at(1_796_034_567, 0);
        assert_eq!(rfc3339(t), "2026-11-30T10:29:27Z");
        assert_eq!(rfc3339_millis(t), "2026-11-30T10:29:27Z");
        assert_eq!(rfc3339_micros(t), "2026-11-30T10:29:27Z");
    }

    #[test]
    fn seconds_drop_the_fraction() {
        assert_eq!(
            rfc3339(at(1_796_034_567, 999_999_999)),
            "2026-11-30T10:29:27Z"
        );
    }

    #[test]
    fn millis_round_and_trim() {
        let t = 1_800_000_010; // 2027-01-15T08:00:10Z
        assert_eq!(
            rfc3339_millis(at(t, 250_999_000)),
            "2027-01-15T08:00:10.251Z"
        );
        assert_eq!(
            rfc3339_millis(at(t, 250_000_000)),
            "2027-01-15T08:00:10.25Z"
        );
        assert_eq!(rfc3339_millis(at(t, 1_499_999)), "2027-01-15T08:00:10.001Z");
        assert_eq!(rfc3339_millis(at(t, 1_500_000)), "2027-01-15T08:00:10.002Z");
        assert_eq!(rfc3339_millis(at(t, 499_999)), "2027-01-15T08:00:10Z");
        assert_eq!(rfc3339_millis(at(t, 999_500_000)), "2027-01-15T08:00:11Z");
        assert_eq!(
            rfc3339_millis(at(1_798_761_599, 999_600_000)),
            "2027-01-01T00:00:00Z"
        );
    }

    #[test]
    fn micros_truncate_and_trim() {
        let t = 1_800_000_010;
        assert_eq!(
            rfc3339_micros(at(t, 250_999_999)),
            "2027-01-15T08:00:10.250999Z"
        );
        assert_eq!(rfc3339_micros(at(t, 500_000_000)), "2027-01-15T08:00:10.5Z");
        assert_eq!(rfc3339_micros(at(t, 999)), "2027-01-15T08:00:10Z");
        assert_eq!(rfc3339_micros(at(t, 1_000)), "2027-01-15T08:00:10.000001Z");
    }

    /// Every day from 1970 to 2400 follows the one before it.
    #[test]
    fn days_follow_each_other() {
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let (mut y, mut m, mut d) = (1970, 1, 1);
        for days in 0..157_000 {
            assert_eq!(civil(days), (y, m, d), "day {days}");
            let len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > len {
                (d, m) = (1, m + 1);
            }
            if m > 12 {
                (m, y) = (1, y + 1);
            }
        }
        assert_eq!(y, 2399);
    }
}
