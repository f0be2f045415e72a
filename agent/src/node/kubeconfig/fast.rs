//! The block-style YAML subset that client-go (kubeadm) writes kubeconfigs in, read in one
//! linear pass without the YAML parser, which spends ~0.1 ms per kubeconfig on its three long
//! base64 lines (ARCHITECTURE.md "Speed"). It builds the very `Value` the YAML parser builds, or
//! gives up (`None`) at the first thing outside the subset, and the caller then runs the full
//! parser, with its shape limits, on the same text: so what is accepted and every error stay
//! the YAML parser's. The subset: LF-terminated lines, indentation by spaces (at most 16
//! columns), `key: value`, `key:` followed by an indented mapping or a `- ` sequence of
//! mappings, `{}`; keys `[A-Za-z][A-Za-z0-9-]*`; values plain scalars of
//! `[A-Za-z0-9._:/+=@-]` starting with a letter or `/`, not ending with `:`, and none of the
//! words YAML reads as null or a boolean. No comments, quotes, tabs, blank lines, aliases,
//! tags, flow collections other than `{}`, duplicate keys (the parser refuses those).

use serde_norway::{Mapping, Value};

const MAX_INDENT: usize = 16;
const MAX_DEPTH: usize = 8;

struct Line<'a> {
    indent: usize,
    /// Starts with the sequence indicator `- ` (after the indentation).
    dash: bool,
    /// The text after the indentation and the indicator.
    body: &'a str,
}

pub(super) fn parse(text: &str) -> Option<Value> {
    let text = text.strip_suffix('\n')?;
    let mut lines = Vec::with_capacity(32);
    for raw in text.split('\n') {
        let body = raw.trim_start_matches(' ');
        let indent = raw.len() - body.len();
        let (dash, body) = match body.strip_prefix("- ") {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        if indent > MAX_INDENT || body.is_empty() || body.starts_with(' ') {
            return None;
        }
        lines.push(Line { indent, dash, body });
    }
    let mut p = Parser { lines, pos: 0 };
    let doc = p.mapping(0, false, 0)?;
    (p.pos == p.lines.len() && !doc.is_empty()).then_some(Value::Mapping(doc))
}

struct Parser<'a> {
    lines: Vec<Line<'a>>,
    pos: usize,
}

impl Parser<'_> {
    /// A block mapping whose keys start at column `col`; `in_item`: its first key is on the
    /// current line, after a sequence indicator.
    fn mapping(&mut self, col: usize, in_item: bool, depth: usize) -> Option<Mapping> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut map = Mapping::new();
        let mut first = in_item;
        while let Some(line) = self.lines.get(self.pos) {
            if !first {
                if line.indent > col {
                    return None;
                }
                if line.indent < col || line.dash {
                    break;
                }
            }
            first = false;
            let (key, value) = split_key(line.body)?;
            self.pos += 1;
            let value = match value {
                Some(v) => scalar(v)?,
                None => {
                    let next = self.lines.get(self.pos)?;
                    if next.dash && next.indent >= col {
                        Value::Sequence(self.sequence(next.indent, depth + 1)?)
                    } else if !next.dash && next.indent > col {
                        Value::Mapping(self.mapping(next.indent, false, depth + 1)?)
                    } else {
                        return None;
                    }
                }
            };
            if map.insert(Value::String(key.to_string()), value).is_some() {
                return None;
            }
        }
        Some(map)
    }

    /// A block sequence of mappings whose indicators are at column `col`.
    fn sequence(&mut self, col: usize, depth: usize) -> Option<Vec<Value>> {
        let mut items = Vec::new();
        while let Some(line) = self.lines.get(self.pos) {
            if line.indent != col || !line.dash {
                if line.indent > col {
                    return None;
                }
                break;
            }
            items.push(Value::Mapping(self.mapping(col + 2, true, depth + 1)?));
        }
        Some(items)
    }
}

/// `key: value` or `key:`.
fn split_key(body: &str) -> Option<(&str, Option<&str>)> {
    let (key, value) = match body.strip_suffix(':') {
        Some(key) => (key, None),
        None => {
            let (key, value) = body.split_once(": ")?;
            (key, Some(value))
        }
    };
    // libyaml refuses implicit keys over 1024 characters; kubeconfig keys are short.
    plain_key(key).then_some((key, value))
}

fn scalar(v: &str) -> Option<Value> {
    if v == "{}" {
        return Some(Value::Mapping(Mapping::new()));
    }
    plain_value(v).then(|| Value::String(v.to_string()))
}

/// Whether `key` is a key of the subset, written plain.
pub(super) fn plain_key(key: &str) -> bool {
    let mut chars = key.bytes();
    key.len() <= 64
        && chars.next().is_some_and(|b| b.is_ascii_alphabetic())
        && chars.all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !special(key)
}

/// Whether `v` is a plain scalar of the subset: a string every YAML reader (1.1 as
/// client-go's go-yaml v2, 1.2 as certrotor's) reads as this very string.
pub(super) fn plain_value(v: &str) -> bool {
    let b = v.as_bytes();
    // Every byte in the subset's set: one table look-up per byte, without a branch (the
    // values are mostly ~2 KB base64 lines).
    let plain = b.iter().fold(true, |ok, &c| ok & PLAIN[usize::from(c)]);
    b.first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'/')
        && b.last() != Some(&b':')
        && plain
        && !special(v)
}

/// The bytes of the subset's plain scalars: `[A-Za-z0-9._:/+=@-]`.
const PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        table[c] = b.is_ascii_alphanumeric()
            || matches!(b, b'.' | b'_' | b':' | b'/' | b'+' | b'=' | b'@' | b'-');
        c += 1;
    }
    table
};

/// Words a YAML parser may read as null or a boolean (1.2 core and 1.1), in any case.
fn special(word: &str) -> bool {
    ["null", "true", "false", "yes", "no", "on", "off", "y", "n"]
        .iter()
        .any(|w| word.eq_ignore_ascii_case(w))
}
