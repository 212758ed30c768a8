//! Human-friendly payload sizes: `5MB`, `512KB`, `2.5MB`, `1048576B`, `5Mi`, `1Gi`, `5`.
//!
//! Units are binary: K = 1024, M = 1024², G = 1024³, whether written `K`, `KB`, `Ki` or
//! `KiB` (any case). A bare number means megabytes, because that is the unit network
//! appliances document their body limits in. Fractions are allowed and rounded down to whole
//! bytes; the result must be at least one byte.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::fmt;

/// Why a payload size did not parse. The message names the offending input and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadSizeError {
    #[error("payload size is empty; use forms like 5MB, 512KB, 2.5MB, 1048576B or 5Mi")]
    Empty,
    #[error("payload size {0:?} has no number; use forms like 5MB, 512KB, 2.5MB, 1048576B or 5Mi")]
    NoNumber(String),
    #[error(
        "payload size {input:?} has an unknown unit {unit:?}; units are B, K/KB/Ki/KiB, M/MB/Mi/MiB, G/GB/Gi/GiB (binary)"
    )]
    UnknownUnit { input: String, unit: String },
    #[error("payload size {0:?} must be greater than zero bytes")]
    Zero(String),
    #[error("payload size {0:?} is too large")]
    Overflow(String),
}

/// A payload size in bytes. Displays in the largest binary unit that divides it evenly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PayloadSize(u64);

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * 1024 * 1024;

impl PayloadSize {
    pub const fn from_bytes(bytes: u64) -> Self {
        Self(bytes)
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// Parses the `payloadCap` field, which may be an integer (megabytes) or a string.
    pub fn from_int_or_string(value: &IntOrString) -> Result<Self, PayloadSizeError> {
        match value {
            IntOrString::Int(n) if *n > 0 => Ok(Self(*n as u64 * MIB)),
            IntOrString::Int(n) => Err(PayloadSizeError::Zero(n.to_string())),
            IntOrString::String(s) => s.parse(),
        }
    }
}

impl std::str::FromStr for PayloadSize {
    type Err = PayloadSizeError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        parse_payload_size(input).map(Self)
    }
}

impl fmt::Display for PayloadSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= GIB && b.is_multiple_of(GIB) {
            write!(f, "{}GiB", b / GIB)
        } else if b >= MIB && b.is_multiple_of(MIB) {
            write!(f, "{}MiB", b / MIB)
        } else if b >= KIB && b.is_multiple_of(KIB) {
            write!(f, "{}KiB", b / KIB)
        } else {
            write!(f, "{b}B")
        }
    }
}

/// Parses a payload size into bytes. See the module documentation for the accepted forms.
pub fn parse_payload_size(input: &str) -> Result<u64, PayloadSizeError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(PayloadSizeError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim_start());
    let mut parts = number.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let frac = parts.next();
    let valid_number = !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()));
    if !valid_number {
        return Err(PayloadSizeError::NoNumber(input.to_string()));
    }
    let multiplier = match unit.to_ascii_lowercase().as_str() {
        "" => MIB,
        "b" => 1,
        "k" | "kb" | "ki" | "kib" => KIB,
        "m" | "mb" | "mi" | "mib" => MIB,
        "g" | "gb" | "gi" | "gib" => GIB,
        _ => {
            return Err(PayloadSizeError::UnknownUnit {
                input: input.to_string(),
                unit: unit.to_string(),
            });
        }
    };
    let overflow = || PayloadSizeError::Overflow(input.to_string());
    let whole: u64 = whole.parse().map_err(|_| overflow())?;
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(overflow)?;
    if let Some(frac) = frac {
        // Exact decimal arithmetic on at most 9 fractional digits; the rest cannot matter
        // at a 1 GiB multiplier (1e-9 GiB is about one byte).
        let digits = &frac[..frac.len().min(9)];
        let numerator: u128 = digits.parse().map_err(|_| overflow())?;
        let denominator = 10u128.pow(digits.len() as u32);
        let extra = numerator * multiplier as u128 / denominator;
        bytes = bytes
            .checked_add(u64::try_from(extra).map_err(|_| overflow())?)
            .ok_or_else(overflow)?;
    }
    if bytes == 0 {
        return Err(PayloadSizeError::Zero(input.to_string()));
    }
    Ok(bytes)
}

/// The regular expression the CRD's CEL rule uses for the string form; kept beside the
/// parser so the two agree (a test checks them against the same table).
pub const PAYLOAD_SIZE_PATTERN: &str =
    r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgG]([iI])?([bB])?|[bB])?\s*$";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        let table: &[(&str, u64)] = &[
            ("5MB", 5 * MIB),
            ("512KB", 512 * KIB),
            ("2.5MB", 5 * MIB / 2),
            ("1048576B", 1_048_576),
            ("5", 5 * MIB),
            ("2.5", 5 * MIB / 2),
            ("5Mi", 5 * MIB),
            ("512Ki", 512 * KIB),
            ("1Gi", GIB),
            ("1GiB", GIB),
            ("1gb", GIB),
            ("10 mb", 10 * MIB),
            ("  64k  ", 64 * KIB),
            ("1.5B", 1),
            ("0.5KB", 512),
            ("0.0000001G", 107),
        ];
        for (input, want) in table {
            assert_eq!(parse_payload_size(input), Ok(*want), "input {input:?}");
        }
    }

    #[test]
    fn garbage_is_a_clear_error() {
        assert_eq!(parse_payload_size(""), Err(PayloadSizeError::Empty));
        assert_eq!(parse_payload_size("   "), Err(PayloadSizeError::Empty));
        for bad in ["MB", "-5MB", "five", ".5MB", "5.MB", "1.2.3MB", "+5"] {
            assert!(
                matches!(parse_payload_size(bad), Err(PayloadSizeError::NoNumber(_))),
                "{bad:?} -> {:?}",
                parse_payload_size(bad)
            );
        }
        for bad in ["5TB", "5 megabytes", "5MBB", "5 M B", "5Kb/s"] {
            assert!(
                matches!(
                    parse_payload_size(bad),
                    Err(PayloadSizeError::UnknownUnit { .. })
                ),
                "{bad:?} -> {:?}",
                parse_payload_size(bad)
            );
        }
        for bad in ["0", "0MB", "0.0KB", "0.1B"] {
            assert!(
                matches!(parse_payload_size(bad), Err(PayloadSizeError::Zero(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_payload_size("99999999999999999999GB"),
            Err(PayloadSizeError::Overflow(_))
        ));
        assert!(matches!(
            parse_payload_size("17179869184GB"),
            Err(PayloadSizeError::Overflow(_))
        ));
        let msg = parse_payload_size("5TB").unwrap_err().to_string();
        assert!(msg.contains("5TB") && msg.contains("binary"), "{msg}");
    }

    #[test]
    fn int_or_string() {
        assert_eq!(
            PayloadSize::from_int_or_string(&IntOrString::Int(5)).map(|p| p.bytes()),
            Ok(5 * MIB)
        );
        assert!(PayloadSize::from_int_or_string(&IntOrString::Int(0)).is_err());
        assert!(PayloadSize::from_int_or_string(&IntOrString::Int(-1)).is_err());
        assert_eq!(
            PayloadSize::from_int_or_string(&IntOrString::String("512KB".into()))
                .map(|p| p.bytes()),
            Ok(512 * KIB)
        );
    }

    #[test]
    fn display_round_trips() {
        for bytes in [1, 1000, 1024, 5 * MIB, 5 * MIB / 2, 3 * GIB] {
            let shown = PayloadSize::from_bytes(bytes).to_string();
            assert_eq!(parse_payload_size(&shown), Ok(bytes), "{shown}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = parse_payload_size(&s);
        }

        #[test]
        fn whole_units_scale(n in 1u64..100_000, unit in proptest::sample::select(vec![("B", 1u64), ("KB", KIB), ("Mi", MIB), ("gib", GIB)])) {
            proptest::prop_assert_eq!(parse_payload_size(&format!("{n}{}", unit.0)), Ok(n * unit.1));
        }
    }
}
