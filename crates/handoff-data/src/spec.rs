//! Dataset specifications, as DataSets.jl's `dataset(project, spec)` reads them: `name[?query][#fragment]`.
//!
//! - `name` follows the name rule ([`crate::name`]);
//! - `query` is `key=value` pairs separated by `&`, each key and value percent-decoded (`y%20y=x%20x` is
//!   `"y y" => "x x"`); a key given twice keeps its last value;
//! - `fragment` is percent-decoded; in a `BlobTree` it is a `/`-separated path that selects a file or a
//!   folder in the tree (`a_tree_example#1.csv`).
//!
//! Where handoff is stricter than Julia (each is an error there that says what is wrong, where DataSets.jl
//! either fails with an unrelated error or quietly does something else):
//! - a query pair with more than one `=` (Julia keeps the first two parts and drops the rest): write `=` in a
//!   value as `%3D`;
//! - a `%` not followed by two hex digits, or percent-decoded bytes that are not UTF-8;
//! - a final newline after the spec (Julia's `$` lets it through).

use std::collections::BTreeMap;

use crate::name::{name_prefix, NAME_RULE};

/// A parsed dataset specification.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataSpec {
    /// The dataset's name (or uuid).
    pub name: String,
    /// The query's pairs, decoded; `None` without `?`.
    pub query: Option<BTreeMap<String, String>>,
    /// The fragment, decoded; `None` without `#`.
    pub fragment: Option<String>,
}

/// Why a specification is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid dataset specification {spec:?}: {reason}")]
pub struct SpecError {
    /// The specification as given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl DataSpec {
    /// Parses `name[?query][#fragment]`.
    pub fn parse(spec: &str) -> Result<DataSpec, SpecError> {
        let fail = |reason: String| SpecError {
            spec: spec.to_string(),
            reason,
        };
        let n = name_prefix(spec);
        if n == 0 {
            let first = spec.chars().next().map(|c| format!("{c:?}"));
            return Err(fail(match first {
                None => format!("it is empty; {NAME_RULE}"),
                Some(c) => format!("the name cannot start with {c}; {NAME_RULE}"),
            }));
        }
        let name = spec[..n].to_string();
        let mut rest = &spec[n..];
        let mut query = None;
        if let Some(after) = rest.strip_prefix('?') {
            let end = after.find('#').unwrap_or(after.len());
            query = Some(parse_query(&after[..end]).map_err(fail)?);
            rest = &after[end..];
        }
        let mut fragment = None;
        if let Some(after) = rest.strip_prefix('#') {
            if after.contains('\n') {
                return Err(fail("the fragment holds a newline".into()));
            }
            fragment = Some(decode(after).map_err(|e| fail(format!("in the fragment: {e}")))?);
            rest = "";
        }
        if let Some(c) = rest.chars().next() {
            return Err(fail(format!(
                "{c:?} after the name {name:?}: a name may be followed only by ?query or #fragment; {NAME_RULE}"
            )));
        }
        Ok(DataSpec { name, query, fragment })
    }

    /// True when the spec is a bare name (no query, no fragment).
    pub fn is_bare(&self) -> bool {
        self.query.is_none() && self.fragment.is_none()
    }
}

fn parse_query(raw: &str) -> Result<BTreeMap<String, String>, String> {
    let mut pairs = BTreeMap::new();
    for part in raw.split('&') {
        let mut kv = part.split('=');
        let (key, value) = match (kv.next(), kv.next(), kv.next()) {
            (Some(k), Some(v), None) => (k, v),
            (_, None, _) => return Err(format!("the query part {part:?} has no '=' (write key=value)")),
            _ => {
                return Err(format!(
                    "the query part {part:?} has more than one '='; write '=' in a key or value as %3D"
                ))
            }
        };
        let key = decode(key).map_err(|e| format!("in the query: {e}"))?;
        let value = decode(value).map_err(|e| format!("in the query: {e}"))?;
        pairs.insert(key, value);
    }
    Ok(pairs)
}

/// Percent-decodes `s`: `%` and two hex digits are a byte; the bytes must be UTF-8.
fn decode(s: &str) -> Result<String, String> {
    if !s.contains('%') {
        return Ok(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit));
            let Some(hex) = hex else {
                let got = String::from_utf8_lossy(&bytes[i..bytes.len().min(i + 3)]).into_owned();
                return Err(format!("{got:?} at byte {i} is not '%' and two hex digits"));
            };
            let text = std::str::from_utf8(hex).expect("hex digits are ASCII");
            out.push(u8::from_str_radix(text, 16).expect("two hex digits"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} percent-decodes to bytes that are not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pairs = Vec<(String, String)>;

    fn parts(spec: &str) -> (String, Option<Pairs>, Option<String>) {
        let s = DataSpec::parse(spec).unwrap();
        (s.name, s.query.map(|q| q.into_iter().collect()), s.fragment)
    }

    #[test]
    fn splits_like_datasets_jl() {
        assert_eq!(parts("foo"), ("foo".into(), None, None));
        assert_eq!(
            parts("foo?x=1#f"),
            ("foo".into(), Some(vec![("x".into(), "1".into())]), Some("f".into()))
        );
        assert_eq!(parts("a_tree#1.csv").2.as_deref(), Some("1.csv"));
        assert_eq!(
            parts("n?y%20y=x%20x").1.unwrap(),
            vec![("y y".to_string(), "x x".to_string())]
        );
        assert_eq!(parts("n#x%ce%b1x").2.as_deref(), Some("xαx"));
        assert_eq!(parts("n?x=1&x=2").1.unwrap(), vec![("x".to_string(), "2".to_string())]);
    }

    #[test]
    fn refuses_what_is_not_a_spec() {
        for bad in [
            "",
            " foo",
            "foo ?x=1",
            "foo\n?x=1",
            "foo #f",
            "@?x=1",
            "-a",
            "a?x",
            "a?",
            "a?x=%zz",
            "a#%ff",
            "a?x=1=2",
            "a#b\n",
        ] {
            let e = DataSpec::parse(bad).unwrap_err();
            assert!(
                e.to_string().starts_with("invalid dataset specification"),
                "{bad:?}: {e}"
            );
        }
    }
}
