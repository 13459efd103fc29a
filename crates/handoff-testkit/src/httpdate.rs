//! HTTP dates (RFC 1123), for Last-Modified and PROPFIND's getlastmodified.

use std::time::{SystemTime, UNIX_EPOCH};

/// Formats a time as `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) fn format(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WD: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MON: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let wd = WD[days.rem_euclid(7) as usize];
    format!(
        "{wd}, {d:02} {} {year} {h:02}:{m:02}:{s:02} GMT",
        MON[(month - 1) as usize]
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(784_111_777);
        assert_eq!(super::format(t), "Sun, 06 Nov 1994 08:49:37 GMT");
    }
}
