//! DataSets.jl's rule for dataset names (its `check_dataset_name`).
//!
//! A name is one or more segments separated by `/` or `.`. Each segment starts with a letter or a digit and
//! goes on with letters, digits, `-` and `_`. Letters and digits are Unicode's: every character of the general
//! categories L (letters) and N (numbers), as PCRE's `[[:alnum:]]` in Julia's Unicode mode. So `δεδομένα`,
//! `a/b.csv` and `1-2-3` are names, and `a b`, `a//b`, `.a`, `a.` and `a/-b` are not.
//!
//! One difference from Julia: its pattern ends with `$`, which PCRE also lets match before a final newline, so
//! DataSets.jl accepts `"abc\n"`. Here a name ends at the end of the string.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// The rule, in the words an error gives.
pub const NAME_RULE: &str = "a dataset name is segments separated by '/' or '.', each starting with a letter or \
a digit and going on with letters, digits, '-' and '_' (DataSets.jl's rule)";

/// True for a Unicode letter (L*) or number (N*), as `[[:alnum:]]` in PCRE's Unicode mode.
pub(crate) fn is_alnum(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric();
    }
    matches!(
        get_general_category(c),
        G::UppercaseLetter
            | G::LowercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter
            | G::DecimalNumber
            | G::LetterNumber
            | G::OtherNumber
    )
}

/// How many bytes at the start of `s` form a name (0 if none does): the longest prefix that matches the rule,
/// as the spec parser needs it.
pub(crate) fn name_prefix(s: &str) -> usize {
    let mut chars = s.char_indices().peekable();
    match chars.next() {
        Some((_, c)) if is_alnum(c) => {}
        _ => return 0,
    }
    let mut end = s.chars().next().map_or(0, char::len_utf8);
    while let Some((i, c)) = chars.next() {
        let ok = if c == '-' || c == '_' || is_alnum(c) {
            true
        } else if c == '.' || c == '/' {
            // A separator counts only when a letter or digit follows it.
            matches!(chars.peek(), Some((_, next)) if is_alnum(*next))
        } else {
            false
        };
        if !ok {
            break;
        }
        end = i + c.len_utf8();
    }
    end
}

/// Checks `name` against DataSets.jl's rule; the error says what is wrong with it.
pub fn check_name(name: &str) -> Result<(), String> {
    let n = name_prefix(name);
    if n == name.len() && n > 0 {
        return Ok(());
    }
    let rest = &name[n..];
    let at = rest.chars().next().map(|c| format!("{c:?}")).unwrap_or_default();
    let why = if name.is_empty() {
        "it is empty".to_string()
    } else if n == 0 {
        format!("it starts with {at}")
    } else {
        format!("{at} at byte {n} breaks it")
    };
    Err(format!("{name:?} is not a valid dataset name: {why}; {NAME_RULE}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for ok in ["a", "1", "a_b", "a-", "x/y.z", "δεδομένα", "a1/2b", "日本語"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "a b", "a//b", "/a", "a/", ".a", "a.", "a..b", "a/-b", "_a", "a.-", "a\n", "a#b", "a?b",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn combining_marks_are_not_letters() {
        // U+0301 (combining acute, Mn) is not [[:alnum:]]; the precomposed é (Ll) is.
        assert!(check_name("e\u{301}").is_err());
        assert!(check_name("\u{e9}").is_ok());
    }

    #[test]
    fn the_error_says_where() {
        let e = check_name("ab cd").unwrap_err();
        assert!(e.contains("' ' at byte 2"), "{e}");
        assert!(check_name("-a").unwrap_err().contains("starts with '-'"));
    }
}
