//! AWS Signature Version 4 for one request (what Bedrock needs), as a pure function of the
//! request, the credentials and the clock.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};

/// Characters AWS leaves unencoded in a path segment or query component.
pub const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What is signed.
pub struct SigningInput<'a> {
    pub method: &'a str,
    /// `host[:port]` exactly as the Host header will carry it.
    pub host: &'a str,
    /// The path as sent on the wire (already percent-encoded).
    pub path: &'a str,
    /// The canonical query string (sorted, encoded); empty for none.
    pub query: &'a str,
    /// Further headers to sign, lower-case names (the signer adds host and x-amz-date).
    pub headers: &'a [(&'a str, &'a str)],
    pub payload: &'a [u8],
    pub region: &'a str,
    pub service: &'a str,
    pub time: SystemTime,
    pub access_key_id: &'a str,
    pub secret_access_key: &'a str,
    pub session_token: Option<&'a str>,
    /// Every service but S3 signs the path encoded once more.
    pub double_encode_path: bool,
}

/// Headers to add to the request: `x-amz-date`, optionally `x-amz-security-token`, and
/// `authorization`.
pub fn sign(input: &SigningInput<'_>) -> Vec<(String, String)> {
    let (date, stamp) = amz_dates(input.time);
    let mut headers: Vec<(String, String)> = input
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    headers.push(("host".into(), input.host.to_string()));
    headers.push(("x-amz-date".into(), stamp.clone()));
    if let Some(t) = input.session_token {
        headers.push(("x-amz-security-token".into(), t.to_string()));
    }
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let path = if input.double_encode_path {
        input
            .path
            .split('/')
            .map(|seg| utf8_percent_encode(seg, PATH_SEGMENT).to_string())
            .collect::<Vec<_>>()
            .join("/")
    } else {
        input.path.to_string()
    };
    let path = if path.is_empty() { "/".into() } else { path };
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        input.method,
        path,
        input.query,
        canonical_headers,
        signed_headers,
        hex::encode(Sha256::digest(input.payload)),
    );
    let scope = format!("{date}/{}/{}/aws4_request", input.region, input.service);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let k_date = hmac(
        format!("AWS4{}", input.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac(&k_date, input.region.as_bytes());
    let k_service = hmac(&k_region, input.service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex::encode(hmac(&k_signing, to_sign.as_bytes()));
    let mut out = vec![("x-amz-date".to_string(), stamp)];
    if let Some(t) = input.session_token {
        out.push(("x-amz-security-token".into(), t.to_string()));
    }
    out.push((
        "authorization".into(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, \
             Signature={signature}",
            input.access_key_id
        ),
    ));
    out
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length, so construction cannot fail.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

/// `(YYYYMMDD, YYYYMMDDTHHMMSSZ)` in UTC.
fn amz_dates(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let date = format!("{y:04}{m:02}{d:02}");
    let stamp = format!(
        "{date}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    (date, stamp)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The worked example of AWS's Signature Version 4 documentation (IAM ListUsers).
    #[test]
    fn matches_the_documented_example() {
        let time = UNIX_EPOCH + Duration::from_secs(1_440_938_160); // 2015-08-30T12:36:00Z
        assert_eq!(amz_dates(time).1, "20150830T123600Z");
        let out = sign(&SigningInput {
            method: "GET",
            host: "iam.amazonaws.com",
            path: "/",
            query: "Action=ListUsers&Version=2010-05-08",
            headers: &[(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            )],
            payload: b"",
            region: "us-east-1",
            service: "iam",
            time,
            access_key_id: "AKIDEXAMPLE",
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            session_token: None,
            double_encode_path: true,
        });
        let auth = &out.iter().find(|(k, _)| k == "authorization").unwrap().1;
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn civil_dates_cover_leap_years() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_819), (2027, 1, 1));
    }
}
