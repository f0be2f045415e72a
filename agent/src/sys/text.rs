//! Text from outside (state files, etcd, the node's files) made safe to print: control and
//! bidirectional characters shown as escapes.

/// Whether `c` may reach a terminal or a log raw: not a control character (C0, DEL, C1), nor a
/// bidirectional formatting character (which reorders what a reader sees). Line feed and tab
/// are the caller's choice.
fn harmless(c: char) -> bool {
    !(c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
}

/// `text` with every character that could rewrite a terminal or forge a line (escape
/// sequences, carriage returns, C1 controls such as CSI U+009B, bidirectional overrides) shown
/// as an escape (`\x1b`, `\u{9b}`); line feeds and tabs kept. Text from state files, etcd and
/// the node's files goes through it before it is printed (issue 30.12).
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().all(|c| harmless(c) || c == '\n' || c == '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if harmless(c) || c == '\n' || c == '\t' {
            out.push(c);
        } else if (c as u32) < 0x80 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// JSON text with the characters JSON allows raw but a terminal obeys (DEL, C1 controls,
/// bidirectional formatting) written as `\uXXXX` escapes: the same JSON value, safe to print.
/// (serde_json already escapes C0 controls.)
pub fn escape_controls_json(json: &str) -> std::borrow::Cow<'_, str> {
    if json.chars().all(harmless_or_c0) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if harmless_or_c0(c) {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{:04x}", c as u32));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Characters [`escape_controls_json`] leaves alone: harmless ones, and C0 controls (which a
/// JSON text holds escaped already; raw, only its own layout: newlines, indentation).
fn harmless_or_c0(c: char) -> bool {
    harmless(c) || (c as u32) < 0x20
}
