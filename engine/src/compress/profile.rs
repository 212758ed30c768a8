//! What each profile keeps. The profile is the user's knob (`compression.profile` in the
//! policy); these tables are what it means, written down once.

use cairn_crds::policy::CompressionProfile;

/// How much the compressors keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Lines kept from the start and the end of a log, source file or text.
    pub head_lines: usize,
    pub tail_lines: usize,
    /// Trace lines kept after each error line (stack frames, `Caused by`, compiler notes).
    pub error_context: usize,
    /// Whether warnings count as lines that must be kept.
    pub keep_warnings: bool,
    /// Matches kept at the start and the end of each file's results.
    pub matches_first: usize,
    pub matches_last: usize,
    /// Unchanged lines kept around each change in a diff.
    pub diff_context: usize,
    /// Items kept at the start and the end of a long JSON array.
    pub json_head: usize,
    pub json_tail: usize,
    /// Error records kept from the middle of a long JSON array, the earliest first.
    pub json_errors: usize,
    /// Indentation up to which source lines count as structure (declarations, blocks).
    pub code_indent: usize,
}

impl Limits {
    pub fn of(profile: CompressionProfile) -> Self {
        match profile {
            CompressionProfile::Conservative => Self {
                head_lines: 60,
                tail_lines: 40,
                error_context: 40,
                keep_warnings: true,
                matches_first: 5,
                matches_last: 3,
                diff_context: 3,
                json_head: 10,
                json_tail: 5,
                json_errors: 10,
                code_indent: 4,
            },
            CompressionProfile::Default => Self {
                head_lines: 30,
                tail_lines: 20,
                error_context: 25,
                keep_warnings: true,
                matches_first: 3,
                matches_last: 2,
                diff_context: 1,
                json_head: 5,
                json_tail: 3,
                json_errors: 5,
                code_indent: 0,
            },
            CompressionProfile::Aggressive => Self {
                head_lines: 10,
                tail_lines: 10,
                error_context: 12,
                keep_warnings: false,
                matches_first: 1,
                matches_last: 1,
                diff_context: 0,
                json_head: 2,
                json_tail: 1,
                json_errors: 3,
                code_indent: 0,
            },
        }
    }
}
