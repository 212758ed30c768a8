//! Char boundaries of UTF-8 text: where a `str` may be cut.

/// Largest index `<= at` that is a char boundary of `s`.
pub fn floor_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    let mut i = at;
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Smallest index `>= at` that is a char boundary of `s`.
pub fn ceil_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    let mut i = at;
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}
