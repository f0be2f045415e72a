//! kubeconfig files: read the current-context user's client certificate, and replace it.
//!
//! kubeadm's renewal (`kubeConfigReadWriter`) resolves `current-context` to a cluster and a
//! user, replaces only that user's `client-certificate-data` and `client-key-data`, and
//! refreshes the cluster's `certificate-authority-data` from `pki/ca.crt`. certrotor does the
//! same on the parsed document and keeps every other key and its order. Comments are not kept
//! (kubeadm does not keep them either).

use std::fmt;

use serde_norway::{Mapping, Value};

/// Where a kubeconfig keeps a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Embedded `*-data` (PEM bytes after base64 decoding).
    Embedded(Vec<u8>),
    /// A file path (`client-certificate`, as kubelet.conf points to
    /// `/var/lib/kubelet/pki/kubelet-client-current.pem`).
    File(String),
}

/// The current context's credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub cluster: String,
    pub server: Option<String>,
    pub client_certificate: Source,
    pub client_key: Source,
    pub certificate_authority: Option<Source>,
}

/// An embedded client key is scrubbed (volatile writes) when the credentials are dropped.
impl Drop for Credentials {
    fn drop(&mut self) {
        if let Source::Embedded(key) = &mut self.client_key {
            zeroize::Zeroize::zeroize(key);
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key may be embedded: never print it.
        write!(
            f,
            "Credentials(user={}, cluster={})",
            self.user, self.cluster
        )
    }
}

/// A kubeconfig problem, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeconfigError(pub String);

impl fmt::Display for KubeconfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KubeconfigError {}

fn err(msg: impl Into<String>) -> KubeconfigError {
    KubeconfigError(msg.into())
}

/// Deepest flow nesting (`[`/`{`) accepted in a YAML document certrotor reads. A kubeconfig or
/// static-pod manifest nests a handful of levels; the YAML parser's work grows with the square
/// of the nesting, so a deep document under the size limit could stall the agent for hours.
pub const MAX_YAML_FLOW_DEPTH: usize = 32;
/// Widest indentation accepted (block nesting is bounded by it).
pub const MAX_YAML_INDENT: usize = 256;
/// Most block indicators (`- `, `? `) accepted at the start of one line (`- - - x` nests).
pub const MAX_YAML_LINE_INDICATORS: usize = 32;
/// Most alias references (`*name`) accepted: kubeconfigs use none, and expanding aliases is how
/// a small document becomes a huge one.
pub const MAX_YAML_ALIASES: usize = 64;

/// Checks, in one linear pass and before the YAML parser sees it, that a document's nesting is
/// bounded (see the constants above). Overestimates the depth (brackets in plain scalars count),
/// which real kubeconfigs and manifests never come near; never underestimates it: a quote
/// starts a quoted scalar (whose brackets are text) only where YAML starts one, at the start of
/// a node (issue 30.5: an apostrophe inside a plain scalar, `[x 'y, [[[…`, hid every bracket
/// after it, and the parser's quadratic work on deep flow nesting came back). The error says
/// what was found; it never quotes the text.
pub fn check_yaml_shape(text: &str) -> Result<(), String> {
    shape_scan(text).0
}

/// [`check_yaml_shape`], with the number of bytes it examined: each at most once, so its work
/// is linear in the text (a refusal stops early).
pub fn shape_scan(text: &str) -> (Result<(), String>, usize) {
    let mut flow: usize = 0;
    let mut aliases = 0usize;
    let mut scanned = 0usize;
    // Where a node may start (so a quote opens a quoted scalar): at the start of a line in
    // block context, and after `[`, `{`, a flow `,`, a `: `, a block indicator, an anchor or a
    // tag. Inside a flow collection a line continues the previous one (a plain scalar may go
    // on over several lines, and a quote at its next line's start is part of it).
    let mut expect_node = true;
    for (n, line) in text.lines().enumerate() {
        let lineno = n + 1;
        let bytes = line.as_bytes();
        let indent = bytes
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        if indent > MAX_YAML_INDENT {
            return (
                Err(format!(
                    "line {lineno} is indented {indent} columns, more than the {MAX_YAML_INDENT} \
                     a kubeconfig or manifest ever needs (a hostile or damaged file?)"
                )),
                scanned + indent,
            );
        }
        if flow == 0 {
            expect_node = true;
        }
        // Leading block indicators: "- - - x".
        let mut i = indent;
        let mut indicators = 0usize;
        while flow == 0
            && i < bytes.len()
            && (bytes[i] == b'-' || bytes[i] == b'?')
            && bytes.get(i + 1).is_none_or(|b| *b == b' ' || *b == b'\t')
        {
            indicators += 1;
            i += 1;
            while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
                i += 1;
            }
        }
        if indicators > MAX_YAML_LINE_INDICATORS {
            return (
                Err(format!(
                    "line {lineno} nests {indicators} block collections, more than the \
                     {MAX_YAML_LINE_INDICATORS} accepted (a hostile or damaged file?)"
                )),
                scanned + i,
            );
        }
        let mut quote: Option<u8> = None;
        let mut prev = b' ';
        let mut j = i;
        while j < bytes.len() {
            let b = bytes[j];
            let next = bytes.get(j + 1).copied();
            let blank_next = next.is_none_or(|c| c == b' ' || c == b'\t');
            match quote {
                Some(q) => {
                    if b == b'\\' && q == b'"' {
                        j += 1;
                    } else if b == q {
                        quote = None;
                    }
                }
                None => match b {
                    b' ' | b'\t' => {}
                    b'#' if prev == b' ' || prev == b'\t' => break,
                    b'\'' | b'"' if expect_node => {
                        quote = Some(b);
                        expect_node = false;
                    }
                    b'[' | b'{' => {
                        flow += 1;
                        expect_node = true;
                        if flow > MAX_YAML_FLOW_DEPTH {
                            return (
                                Err(format!(
                                    "line {lineno} nests brackets more than {MAX_YAML_FLOW_DEPTH} \
                                     deep (a hostile or damaged file?)"
                                )),
                                scanned + j + 1,
                            );
                        }
                    }
                    b']' | b'}' => {
                        flow = flow.saturating_sub(1);
                        expect_node = false;
                    }
                    b',' if flow > 0 => expect_node = true,
                    b':' if blank_next => expect_node = true,
                    b'-' | b'?' if expect_node && flow == 0 && blank_next => {}
                    b'&' | b'!' if expect_node => {
                        // An anchor or a tag: its name, then still the start of a node.
                        while j + 1 < bytes.len()
                            && !matches!(bytes[j + 1], b' ' | b'\t')
                            && !(flow > 0
                                && matches!(bytes[j + 1], b',' | b'[' | b']' | b'{' | b'}'))
                        {
                            j += 1;
                        }
                    }
                    // Counted wherever an alias may start, and wherever the old check counted
                    // one (after a blank or a flow indicator): more is safe, fewer is not.
                    b'*' if expect_node
                        || matches!(prev, b' ' | b'\t' | b'[' | b'{' | b',' | b':') =>
                    {
                        aliases += 1;
                        expect_node = false;
                        if aliases > MAX_YAML_ALIASES {
                            return (
                                Err(format!(
                                    "more than {MAX_YAML_ALIASES} YAML aliases (a hostile or \
                                     damaged file?)"
                                )),
                                scanned + j + 1,
                            );
                        }
                    }
                    _ => expect_node = false,
                },
            }
            prev = b;
            j += 1;
        }
        // A line ending inside a quoted scalar: the next line is examined as plain text (the
        // quote's brackets count, an overestimate).
        scanned += bytes.len() + 1;
    }
    (Ok(()), scanned.min(text.len()))
}

/// A parsed kubeconfig document.
#[derive(Clone)]
pub struct Kubeconfig {
    doc: Value,
}

/// Every user's `client-key-data` is scrubbed (volatile writes) when the document is dropped.
impl Drop for Kubeconfig {
    fn drop(&mut self) {
        self.scrub_keys();
    }
}

impl Kubeconfig {
    /// Zeroes (and empties) every user's `client-key-data`.
    fn scrub_keys(&mut self) {
        if let Some(users) = self.doc.get_mut("users").and_then(Value::as_sequence_mut) {
            for user in users {
                if let Some(data) = user
                    .get_mut("user")
                    .and_then(|u| u.get_mut("client-key-data"))
                {
                    scrub(data);
                }
            }
        }
    }
}

/// Zeroes a YAML value that may hold key material (its string's bytes).
fn scrub(value: &mut Value) {
    if let Value::String(text) = value {
        zeroize::Zeroize::zeroize(text);
    }
}

impl fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Kubeconfig(<redacted>)")
    }
}

impl Kubeconfig {
    /// Parses YAML (or JSON) text.
    ///
    /// Read as client-go reads it, or refused with the reason (issue 30.11): a UTF-8 byte order
    /// mark is skipped, as client-go skips it; a name twice in `clusters`, `users` or
    /// `contexts` is refused (client-go refuses the whole file: "duplicate name in list"), as
    /// are a key twice in a mapping (client-go takes the last, the YAML parser refuses) and
    /// several YAML documents (client-go reads the first: certrotor does not guess which one a
    /// renewal should rewrite).
    pub fn parse(bytes: &[u8]) -> Result<Kubeconfig, KubeconfigError> {
        let text =
            std::str::from_utf8(bytes).map_err(|_| err("the kubeconfig is not UTF-8 text"))?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let doc = match fast::parse(text) {
            Some(doc) => doc,
            None => {
                check_yaml_shape(text)
                    .map_err(|e| err(format!("the kubeconfig is refused: {e}")))?;
                let doc: Value = serde_norway::from_str(text).map_err(|e| {
                    let documents = serde_norway::Deserializer::from_str(text).take(3).count();
                    if documents > 1 {
                        err(
                            "the kubeconfig holds several YAML documents ('---'); client-go \
                             reads only the first, and certrotor does not guess which one to \
                             renew: keep one document in the file",
                        )
                    } else if e.to_string().contains("duplicate entry") {
                        err(format!(
                            "the kubeconfig is not valid YAML: {e}; client-go would take the \
                             last one, certrotor does not guess: remove the duplicate key"
                        ))
                    } else {
                        err(format!("the kubeconfig is not valid YAML: {e}"))
                    }
                })?;
                if !doc.is_mapping() {
                    return Err(err("the kubeconfig is not a YAML mapping"));
                }
                doc
            }
        };
        for (list, what) in [
            ("clusters", "cluster"),
            ("users", "user"),
            ("contexts", "context"),
        ] {
            let names: Vec<&str> = doc
                .get(list)
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(|i| i.get("name").and_then(Value::as_str))
                .collect();
            if let Some(twice) = names
                .iter()
                .enumerate()
                .find_map(|(i, n)| names[..i].contains(n).then_some(*n))
            {
                return Err(err(format!(
                    "the kubeconfig names {what} '{twice}' twice in '{list}'; client-go (kubectl, \
                     the components) refuses such a file (duplicate name in list): remove one"
                )));
            }
        }
        Ok(Kubeconfig { doc })
    }

    /// Serializes back to YAML.
    ///
    /// Written as client-go writes kubeconfigs (go-yaml v2's block style: sequences at their
    /// key's indentation, `{}` for an empty mapping), with every string that a YAML 1.1 reader
    /// (client-go) or a YAML 1.2 one could read as something else double-quoted: `on`, `NO`,
    /// `1_000`, `12:30`, `2001-12-14` as names stay strings for kubectl (issue 30.3: written
    /// plain by the YAML library, kubectl refused the renewed file). The text is read back before
    /// it is returned: it must give the very document.
    pub fn to_yaml(&self) -> Result<String, KubeconfigError> {
        let Value::Mapping(map) = &self.doc else {
            return Err(err("cannot write the kubeconfig: it is not a YAML mapping"));
        };
        let mut out = String::with_capacity(8192);
        if map.is_empty() {
            out.push_str("{}\n");
        } else {
            emit_entries(&mut out, map, 0, false)?;
        }
        let again = Kubeconfig::parse(out.as_bytes()).map_err(|e| {
            err(format!(
                "cannot write the kubeconfig: it would not read back ({e})"
            ))
        })?;
        if again.doc != self.doc {
            return Err(err(
                "cannot write the kubeconfig: it would not read back as the same document",
            ));
        }
        Ok(out)
    }

    /// Builds a kubeconfig the way kubeadm's `CreateWithCerts` does.
    pub fn new_embedded(
        cluster: &str,
        server: &str,
        user: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Kubeconfig {
        let b64 = |b: &[u8]| Value::String(base64_encode(b));
        let map = |pairs: Vec<(&str, Value)>| {
            let mut m = Mapping::new();
            for (k, v) in pairs {
                m.insert(Value::String(k.into()), v);
            }
            Value::Mapping(m)
        };
        let context_name = format!("{user}@{cluster}");
        let doc = map(vec![
            ("apiVersion", Value::String("v1".into())),
            (
                "clusters",
                Value::Sequence(vec![map(vec![
                    (
                        "cluster",
                        map(vec![
                            ("certificate-authority-data", b64(ca_pem)),
                            ("server", Value::String(server.into())),
                        ]),
                    ),
                    ("name", Value::String(cluster.into())),
                ])]),
            ),
            (
                "contexts",
                Value::Sequence(vec![map(vec![
                    (
                        "context",
                        map(vec![
                            ("cluster", Value::String(cluster.into())),
                            ("user", Value::String(user.into())),
                        ]),
                    ),
                    ("name", Value::String(context_name.clone())),
                ])]),
            ),
            ("current-context", Value::String(context_name)),
            ("kind", Value::String("Config".into())),
            ("preferences", Value::Mapping(Mapping::new())),
            (
                "users",
                Value::Sequence(vec![map(vec![
                    ("name", Value::String(user.into())),
                    (
                        "user",
                        map(vec![
                            ("client-certificate-data", b64(cert_pem)),
                            ("client-key-data", b64(key_pem)),
                        ]),
                    ),
                ])]),
            ),
        ]);
        Kubeconfig { doc }
    }

    /// The current context's credentials.
    pub fn credentials(&self) -> Result<Credentials, KubeconfigError> {
        let (user_name, cluster_name) = self.current()?;
        let user = named(&self.doc, "users", &user_name, "user")?;
        let cluster = named(&self.doc, "clusters", &cluster_name, "cluster")?;
        let source =
            |m: &Value, data: &str, file: &str| -> Result<Option<Source>, KubeconfigError> {
                if let Some(v) = m.get(data).and_then(Value::as_str) {
                    // Certificates are public: only the key needs constant-time decoding.
                    let bytes = if data == "client-key-data" {
                        base64_decode(v)
                    } else {
                        base64_decode_public(v)
                    }
                    .ok_or_else(|| err(format!("'{data}' is not valid base64")))?;
                    return Ok(Some(Source::Embedded(bytes)));
                }
                Ok(m.get(file)
                    .and_then(Value::as_str)
                    .map(|p| Source::File(p.to_string())))
            };
        let client_certificate = source(user, "client-certificate-data", "client-certificate")?
            .ok_or_else(|| {
                err(format!(
                    "user '{user_name}' has no client-certificate-data or client-certificate"
                ))
            })?;
        let client_key = source(user, "client-key-data", "client-key")?.ok_or_else(|| {
            err(format!(
                "user '{user_name}' has no client-key-data or client-key"
            ))
        })?;
        Ok(Credentials {
            user: user_name,
            cluster: cluster_name,
            server: cluster
                .get("server")
                .and_then(Value::as_str)
                .map(str::to_string),
            client_certificate,
            client_key,
            certificate_authority: source(
                cluster,
                "certificate-authority-data",
                "certificate-authority",
            )?,
        })
    }

    /// Replaces the current user's embedded client certificate and key, and the current
    /// cluster's CA data. Refuses a kubeconfig whose credentials are files (kubeadm refuses too).
    pub fn replace_credentials(
        &mut self,
        cert_pem: &[u8],
        key_pem: &[u8],
        ca_pem: &[u8],
    ) -> Result<(), KubeconfigError> {
        let (user_name, cluster_name) = self.current()?;
        let creds = self.credentials()?;
        if !matches!(creds.client_certificate, Source::Embedded(_))
            || !matches!(creds.client_key, Source::Embedded(_))
        {
            return Err(err(format!(
                "user '{user_name}' does not embed its client certificate and key; certrotor \
                 renews embedded credentials only, as kubeadm does"
            )));
        }
        let user = named_mut(&mut self.doc, "users", &user_name, "user")?;
        user.insert(
            Value::String("client-certificate-data".into()),
            Value::String(base64_encode(cert_pem)),
        );
        if let Some(mut old_key) = user.insert(
            Value::String("client-key-data".into()),
            Value::String(base64_encode(key_pem)),
        ) {
            scrub(&mut old_key);
        }
        let cluster = named_mut(&mut self.doc, "clusters", &cluster_name, "cluster")?;
        cluster.insert(
            Value::String("certificate-authority-data".into()),
            Value::String(base64_encode(ca_pem)),
        );
        Ok(())
    }

    fn current(&self) -> Result<(String, String), KubeconfigError> {
        let current = self
            .doc
            .get("current-context")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| err("the kubeconfig has no current-context"))?;
        let context = named(&self.doc, "contexts", current, "context")?;
        let field = |k: &str| {
            context
                .get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| err(format!("context '{current}' names no {k}")))
        };
        Ok((field("user")?, field("cluster")?))
    }
}

/// The entries of a non-empty mapping at `indent`; `inline_first`: the first one goes on the
/// current line (after a sequence's `- `).
fn emit_entries(
    out: &mut String,
    map: &Mapping,
    indent: usize,
    inline_first: bool,
) -> Result<(), KubeconfigError> {
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 || !inline_first {
            out.push_str(&" ".repeat(indent));
        }
        match k {
            Value::String(s) if fast::plain_key(s) => out.push_str(s),
            Value::Mapping(_) | Value::Sequence(_) | Value::Tagged(_) => {
                return Err(err(
                    "cannot write the kubeconfig: it has a key that is not a plain value",
                ));
            }
            other => out.push_str(&scalar_text(other)?),
        }
        out.push(':');
        match v {
            Value::Mapping(m) if !m.is_empty() => {
                out.push('\n');
                emit_entries(out, m, indent + 2, false)?;
            }
            Value::Sequence(s) if !s.is_empty() => {
                out.push('\n');
                emit_items(out, s, indent)?;
            }
            other => {
                out.push(' ');
                out.push_str(&scalar_text(other)?);
                out.push('\n');
            }
        }
    }
    Ok(())
}

/// The items of a non-empty sequence, their `- ` at `indent`.
fn emit_items(out: &mut String, seq: &[Value], indent: usize) -> Result<(), KubeconfigError> {
    for item in seq {
        out.push_str(&" ".repeat(indent));
        out.push_str("- ");
        match item {
            Value::Mapping(m) if !m.is_empty() => emit_entries(out, m, indent + 2, true)?,
            Value::Sequence(s) if !s.is_empty() => {
                out.push('\n');
                emit_items(out, s, indent + 2)?;
            }
            other => {
                out.push_str(&scalar_text(other)?);
                out.push('\n');
            }
        }
    }
    Ok(())
}

/// A scalar (or an empty collection) as YAML text: a string plain when every YAML reader reads
/// it back as that string ([`fast::plain_value`]), else double-quoted (JSON's string syntax is
/// YAML's double-quoted style).
fn scalar_text(v: &Value) -> Result<String, KubeconfigError> {
    Ok(match v {
        Value::String(s) if fast::plain_value(s) => s.clone(),
        Value::String(s) => serde_json::to_string(s)
            .map_err(|e| err(format!("cannot write the kubeconfig: {e}")))?,
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Mapping(m) if m.is_empty() => "{}".into(),
        Value::Sequence(s) if s.is_empty() => "[]".into(),
        Value::Mapping(_) | Value::Sequence(_) | Value::Tagged(_) => {
            return Err(err(
                "cannot write the kubeconfig: it holds a YAML tag or a collection where a value \
                 was expected, which client-go never writes; renew it with kubeadm",
            ));
        }
    })
}

/// Where a file a kubeconfig names (`client-certificate`, `client-key`) is, relative to the node
/// root: client-go resolves a relative path against the kubeconfig's own folder
/// (`ResolvePaths`), not against the folder it runs in (issue 30.11); an absolute one as the
/// node sees it. `kubeconfig` is the kubeconfig's path relative to the root.
pub fn file_under_root(kubeconfig: &str, named: &str) -> String {
    if named.starts_with('/') {
        return named.trim_start_matches('/').to_string();
    }
    match kubeconfig.trim_start_matches('/').rsplit_once('/') {
        Some((folder, _)) => format!("{folder}/{named}"),
        None => named.to_string(),
    }
}

/// Finds `list[*]` with `name == wanted` and returns its `inner` mapping.
fn named<'a>(
    doc: &'a Value,
    list: &str,
    wanted: &str,
    inner: &str,
) -> Result<&'a Value, KubeconfigError> {
    doc.get(list)
        .and_then(Value::as_sequence)
        .and_then(|items| {
            items
                .iter()
                .find(|i| i.get("name").and_then(Value::as_str) == Some(wanted))
        })
        .and_then(|i| i.get(inner))
        .filter(|v| v.is_mapping())
        .ok_or_else(|| {
            err(format!(
                "the kubeconfig has no {inner} named '{wanted}' in '{list}'"
            ))
        })
}

fn named_mut<'a>(
    doc: &'a mut Value,
    list: &str,
    wanted: &str,
    inner: &str,
) -> Result<&'a mut Mapping, KubeconfigError> {
    doc.get_mut(list)
        .and_then(Value::as_sequence_mut)
        .and_then(|items| {
            items
                .iter_mut()
                .find(|i| i.get("name").and_then(Value::as_str) == Some(wanted))
        })
        .and_then(|i| i.get_mut(inner))
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| {
            err(format!(
                "the kubeconfig has no {inner} named '{wanted}' in '{list}'"
            ))
        })
}

/// The block-style YAML subset that client-go (kubeadm) writes kubeconfigs in, read in one
/// linear pass without the YAML parser, which spends ~0.1 ms per kubeconfig on its three long
/// base64 lines (ARCHITECTURE.md "Speed"). It builds the very `Value` the YAML parser builds, or
/// gives up (`None`) at the first thing outside the subset, and the caller then runs the full
/// parser, with its shape limits, on the same text: so what is accepted and every error stay
/// the YAML parser's. The subset: LF-terminated lines, indentation by spaces (at most 16
/// columns), `key: value`, `key:` followed by an indented mapping or a `- ` sequence of
/// mappings, `{}`; keys `[A-Za-z][A-Za-z0-9-]*`; values plain scalars of
/// `[A-Za-z0-9._:/+=@-]` starting with a letter or `/`, not ending with `:`, and none of the
/// words YAML reads as null or a boolean. No comments, quotes, tabs, blank lines, aliases,
/// tags, flow collections other than `{}`, duplicate keys (the parser refuses those).
mod fast {
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
}

/// Standard base64 with padding, unwrapped (as client-go writes `*-data`).
pub fn base64_encode(data: &[u8]) -> String {
    <base64ct::Base64 as base64ct::Encoding>::encode_string(data)
}

/// Decodes standard base64 in constant time (key material), ignoring whitespace (YAML
/// folding), padded or not. `None` on any other stray character.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64ct::{Base64Unpadded, Encoding};
    lenient(text, |t| {
        // One buffer for both attempts, scrubbed if neither decodes (a failed attempt may have
        // written part of the key into it).
        let mut out = zeroize::Zeroizing::new(vec![0u8; t.len() / 4 * 3 + 3]);
        let len = match certrotor_hot::base64_decode(t.as_bytes(), &mut out) {
            Ok(decoded) => decoded.len(),
            Err(_) => Base64Unpadded::decode(t, &mut out).ok()?.len(),
        };
        out.truncate(len);
        Some(std::mem::take(&mut *out))
    })
}

/// [`base64_decode`] for public data (certificates), several times faster: the `base64`
/// crate's table-driven decoder, whose timing depends on the data. Accepts and refuses exactly
/// what [`base64_decode`] does.
pub fn base64_decode_public(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    lenient(text, |t| {
        STANDARD
            .decode(t)
            .or_else(|_| STANDARD_NO_PAD.decode(t))
            .ok()
    })
}

/// `decode` of the text, or of the text without its whitespace. kubeadm writes the data on
/// one line: the decoders refuse whitespace, so the text is only copied without it when the
/// first attempt fails.
fn lenient(text: &str, decode: impl Fn(&str) -> Option<Vec<u8>>) -> Option<Vec<u8>> {
    decode(text).or_else(|| {
        // Scrubbed: the text may be key material.
        let compact = zeroize::Zeroizing::new(text.split_ascii_whitespace().collect::<String>());
        (compact.len() != text.len())
            .then(|| decode(&compact))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
            assert_eq!(base64_decode(&base64_encode(data)).unwrap(), data);
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert!(base64_decode("Zm9v!").is_none());
        assert_eq!(base64_decode("Zm9v\n YmFy").unwrap(), b"foobar");
        assert_eq!(base64_decode("Zm8").unwrap(), b"fo");
    }

    /// The public decoder is only faster: every input gets the constant-time decoder's answer.
    #[test]
    fn public_base64_decodes_what_the_constant_time_decoder_decodes() {
        let mut inputs: Vec<String> = [
            "",
            "Zg==",
            "Zg",
            "Zg=",
            "Zg===",
            "Zm8=",
            "Zm8",
            "Zm9v",
            "Zm9vYg==",
            "Zm9v\n YmFy",
            "Zm9vYmFy\n",
            " Zm9v",
            "Zh==",
            "Zm9=",
            "Z",
            "Zm9vY",
            "Zm9v!",
            "Zm9v-_",
            "Zm9v+/==",
            "=",
            "====",
            "Zm9v====",
            "Zm=8",
            "Zm9vYmFy=",
            "\tZm9v\r\n",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let lab = base64_encode(&(0..=255u8).cycle().take(1500).collect::<Vec<_>>());
        inputs.push(lab.clone());
        inputs.push(lab.trim_end_matches('=').to_string());
        // Every single-character corruption of a short text.
        for i in 0..8 {
            for c in ["=", "A", "/", "*", " ", "\u{e9}"] {
                let mut t = "Zm9vYmE=".to_string();
                t.replace_range(i..i + 1, c);
                inputs.push(t);
            }
        }
        let mut some = 0;
        for text in &inputs {
            let expect = base64_decode(text);
            some += usize::from(expect.is_some());
            assert_eq!(base64_decode_public(text), expect, "{text:?}");
        }
        assert!(some > 10 && some < inputs.len(), "both outcomes covered");
    }

    #[test]
    fn replaces_only_the_current_user() {
        let yaml = r#"apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: b2xkY2E=
    server: https://10.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: kubernetes-admin
  name: kubernetes-admin@kubernetes
- context:
    cluster: kubernetes
    user: other
  name: other@kubernetes
current-context: kubernetes-admin@kubernetes
kind: Config
preferences: {}
users:
- name: kubernetes-admin
  user:
    client-certificate-data: b2xkY2VydA==
    client-key-data: b2xka2V5
- name: other
  user:
    client-certificate-data: a2VlcA==
    client-key-data: a2VlcA==
"#;
        let mut kc = Kubeconfig::parse(yaml.as_bytes()).unwrap();
        let creds = kc.credentials().unwrap();
        assert_eq!(creds.user, "kubernetes-admin");
        assert_eq!(
            creds.client_certificate,
            Source::Embedded(b"oldcert".to_vec())
        );
        kc.replace_credentials(b"newcert", b"newkey", b"newca")
            .unwrap();
        let out = kc.to_yaml().unwrap();
        let again = Kubeconfig::parse(out.as_bytes())
            .unwrap()
            .credentials()
            .unwrap();
        assert_eq!(
            again.client_certificate,
            Source::Embedded(b"newcert".to_vec())
        );
        assert_eq!(again.client_key, Source::Embedded(b"newkey".to_vec()));
        assert_eq!(
            again.certificate_authority,
            Some(Source::Embedded(b"newca".to_vec()))
        );
        assert!(out.contains("a2VlcA=="), "other user kept");
        assert!(out.contains("server: https://10.0.0.1:6443"));
        assert!(
            out.find("apiVersion").unwrap() < out.find("users").unwrap(),
            "order kept"
        );
    }

    #[test]
    fn every_users_embedded_key_is_scrubbed() {
        let two_users = format!("{SMALL}- name: other\n  user:\n    client-key-data: a2V5\n");
        let mut kc = Kubeconfig::parse(two_users.as_bytes()).unwrap();
        assert!(kc.to_yaml().unwrap().contains("client-key-data: a2V5"));
        kc.scrub_keys();
        let out = kc.to_yaml().unwrap();
        assert!(!out.contains("LS0tS2V5") && !out.contains("a2V5"), "{out}");
        assert!(
            out.contains("client-certificate-data: LS0tQ2VydA=="),
            "the rest is kept"
        );
    }

    /// The full YAML parser's reading of a text, as the fast path must give it.
    fn full(text: &str) -> Option<Value> {
        check_yaml_shape(text).ok()?;
        serde_norway::from_str::<Value>(text).ok()
    }

    const SMALL: &str = "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: \
        LS0tQ2E=\n    server: https://10.0.0.1:6443\n  name: kubernetes\ncontexts:\n- context:\n    \
        cluster: kubernetes\n    user: admin\n  name: admin@kubernetes\ncurrent-context: \
        admin@kubernetes\nkind: Config\npreferences: {}\nusers:\n- name: admin\n  user:\n    \
        client-certificate-data: LS0tQ2VydA==\n    client-key-data: LS0tS2V5\n";

    #[test]
    fn fast_path_reads_what_the_yaml_parser_reads() {
        let lab = Kubeconfig::new_embedded(
            "kubernetes",
            "https://10.0.0.10:6443",
            "kubernetes-admin",
            b"-----BEGIN CERTIFICATE-----\nca\n",
            b"-----BEGIN CERTIFICATE-----\ncert\n",
            b"-----BEGIN RSA PRIVATE KEY-----\nkey\n",
        )
        .to_yaml()
        .unwrap();
        let kubelet = "apiVersion: v1\nclusters:\n- cluster:\n    server: https://x\n  name: c\n\
            contexts:\n- context:\n    cluster: c\n    user: u\n  name: ctx\ncurrent-context: ctx\n\
            kind: Config\nusers:\n- name: u\n  user:\n    client-certificate: /var/lib/kubelet/\
            pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-\
            current.pem\n";
        let indented = "users:\n  - name: u\n    user:\n      a: b\nkind: Config\n";
        for text in [SMALL, &lab, kubelet, indented] {
            let fast = fast::parse(text);
            assert!(fast.is_some(), "fast path refused:\n{text}");
            assert_eq!(fast, full(text), "{text}");
        }
    }

    #[test]
    fn fast_path_leaves_everything_else_to_the_yaml_parser() {
        for text in [
            "a: b",                // no final newline
            "a: b\r\n",            // CRLF
            "a: b # note\n",       // comment
            "a: 'b'\n",            // quotes
            "a:\tb\n",             // tab
            "a: b\n\nc: d\n",      // blank line
            "a: b\na: c\n",        // duplicate key
            "a: yes\n",            // YAML 1.1 boolean
            "a: 12\n",             // number
            "a: ~\n",              // null
            "a:\n",                // null by omission
            "a: [b]\n",            // flow sequence
            "a: &x b\nc: *x\n",    // anchor and alias
            "a:\n  b: c\n d: e\n", // bad indentation
            "- a: b\n",            // top-level sequence
            "a: b:\n",             // mapping value in a scalar
            "true: b\n",           // boolean key
        ] {
            assert_eq!(fast::parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn fast_path_never_differs_from_the_yaml_parser_on_damaged_text() {
        // Every one-byte change of a kubeconfig: the fast path either gives up or reads exactly
        // what the YAML parser reads.
        let bytes = SMALL.as_bytes();
        let mut accepted = 0;
        for i in 0..bytes.len() {
            let mut variants = Vec::new();
            for c in [
                b' ', b'-', b':', b'#', b'"', b'\n', b'x', b'1', b'{', b'/', b'\t',
            ] {
                let mut m = bytes.to_vec();
                m[i] = c;
                variants.push(m);
                let mut m = bytes.to_vec();
                m.insert(i, c);
                variants.push(m);
            }
            let mut m = bytes.to_vec();
            m.remove(i);
            variants.push(m);
            for m in variants {
                let Ok(text) = std::str::from_utf8(&m) else {
                    continue;
                };
                if let Some(v) = fast::parse(text) {
                    accepted += 1;
                    assert_eq!(Some(v), full(text), "{text}");
                }
            }
        }
        assert!(
            accepted > 100,
            "the fast path accepted only {accepted} variants"
        );
    }

    /// Issue 30.5: a quote inside a plain scalar starts no quoted scalar (YAML's rule), so it
    /// hides no bracket after it; real quoted scalars still hide theirs.
    #[test]
    fn a_quote_inside_a_plain_scalar_hides_no_bracket() {
        let deep = "[".repeat(MAX_YAML_FLOW_DEPTH + 1);
        for text in [
            format!("a: [x 'y, {deep}\n"),
            format!("a: [x \"y, {deep}\n"),
            format!(
                "a: {{k: x 'y, b: {}\n",
                "{a: ".repeat(MAX_YAML_FLOW_DEPTH + 1)
            ),
            format!("a: b'c: {deep}\n"),
            format!("- x 'y {deep}\n"),
            format!("a: [x, y'z, {deep}]\n"),
            format!("a: it's [{deep}\n"),
            // A plain scalar continued on the next line inside a flow collection: the quote
            // at that line's start is part of it.
            format!("a: [x\n 'y, {deep}\n"),
            format!("a: [x,\n y\n 'z, {deep}\n"),
            format!("a: {{k: v\n  'w: {deep}}}\n"),
        ] {
            let e = check_yaml_shape(&text).expect_err(&text);
            assert!(e.contains("nests brackets"), "{text}: {e}");
        }
        // Brackets inside real quoted scalars are text.
        for text in [
            format!("a: '{deep}'\n"),
            format!("a: \"{deep}\"\n"),
            format!("a: [x, '{deep}', \"{deep}\"]\n"),
            format!("a: {{k: '{deep}'}}\n"),
            format!("- '{deep}'\n"),
            format!("'{deep}': v\n"),
            format!("a: &x '{deep}'\n"),
            format!("a: !!str '{deep}'\n"),
        ] {
            assert_eq!(check_yaml_shape(&text), Ok(()), "{text}");
            assert!(serde_norway::from_str::<Value>(&text).is_ok(), "{text}");
        }
    }

    /// Issue 30.5, the growth measured as work: the shape check examines each byte at most
    /// once (so it is linear), refuses every hostile family before the parser sees it, and
    /// reads a large legitimate kubeconfig to its end. `agent/parser-growth.sh` counts `check`'s instructions on
    /// the same families, growing, with the real parser behind.
    #[test]
    fn the_shape_check_examines_each_byte_at_most_once() {
        let user = "- name: u\n  user:\n    client-certificate-data: LS0tQ2VydA==\n    \
                    client-key-data: LS0tS2V5\n";
        for size in [1usize << 10, 1 << 14, 1 << 17, 1 << 20] {
            let hostile = [
                ("apostrophe", format!("a: [x 'y, {}\n", "[".repeat(size))),
                ("quote", format!("a: [x \"y, {}\n", "[".repeat(size))),
                ("continued", format!("a: [x\n 'y, {}\n", "[".repeat(size))),
                (
                    "flow map",
                    format!("a: {}\n", "{k: x 'y, b: ".repeat(size / 12)),
                ),
                ("aliases", "a: [*x, ".repeat(size / 8)),
                ("indicators", format!("{}x\n", "- ".repeat(size / 2))),
                ("indent", format!("{}k: v\n", " ".repeat(size))),
            ];
            for (what, doc) in &hostile {
                let (result, scanned) = shape_scan(doc);
                assert!(result.is_err(), "{what} {size}: accepted");
                assert!(
                    scanned <= doc.len(),
                    "{what} {size}: {scanned} > {}",
                    doc.len()
                );
            }
            let legit = format!("{SMALL}{}", user.repeat(size / user.len()));
            let (result, scanned) = shape_scan(&legit);
            assert_eq!(result, Ok(()));
            assert_eq!(
                scanned,
                legit.len(),
                "{size}: every byte of a sound file, once"
            );
        }
    }

    /// Issue 30.3: names YAML 1.1 (client-go) reads as booleans, nulls, numbers or dates are
    /// written quoted, and the written text reads back as the same document; a kubeadm-shaped
    /// kubeconfig is written exactly as client-go writes it.
    #[test]
    fn names_yaml_1_1_reads_otherwise_are_written_quoted() {
        for name in [
            "on",
            "OFF",
            "no",
            "Y",
            "n",
            "true",
            "null",
            "~",
            "1_000",
            "0x1F",
            "1e3",
            ".inf",
            "12:30",
            "1:20:30",
            "2001-12-14",
            "=",
            "<<",
            "- x",
            "a: b",
            "c #d",
            "'q'",
            "",
            " lead",
            "caf\u{e9}",
            "x\ny",
        ] {
            let text = SMALL
                .replace(
                    "name: admin\n",
                    &format!("name: {}\n", serde_json::to_string(name).unwrap()),
                )
                .replace(
                    "user: admin\n",
                    &format!("user: {}\n", serde_json::to_string(name).unwrap()),
                );
            let kc = Kubeconfig::parse(text.as_bytes()).unwrap();
            let out = kc.to_yaml().unwrap();
            assert!(
                out.contains(&format!(
                    "- name: {}\n",
                    serde_json::to_string(name).unwrap()
                )),
                "{name:?} not quoted:\n{out}"
            );
            let again = Kubeconfig::parse(out.as_bytes()).unwrap();
            assert_eq!(again.doc, kc.doc, "{name:?}");
            assert_eq!(again.credentials().unwrap().user, name);
        }
        let kc = Kubeconfig::parse(SMALL.as_bytes()).unwrap();
        assert_eq!(kc.to_yaml().unwrap(), SMALL);
    }

    /// Issue 30.11: read as client-go reads, or refused with the reason.
    #[test]
    fn kubeconfigs_are_read_as_client_go_reads_them_or_refused() {
        let bom = format!("\u{feff}{SMALL}");
        assert_eq!(
            Kubeconfig::parse(bom.as_bytes()).unwrap().doc,
            Kubeconfig::parse(SMALL.as_bytes()).unwrap().doc
        );
        let two_users = format!("{SMALL}- name: admin\n  user:\n    token: x\n");
        let e = Kubeconfig::parse(two_users.as_bytes()).unwrap_err().0;
        assert!(
            e.contains("user 'admin' twice") && e.contains("client-go"),
            "{e}"
        );
        let two_docs = format!("{SMALL}---\n{SMALL}");
        let e = Kubeconfig::parse(two_docs.as_bytes()).unwrap_err().0;
        assert!(e.contains("several YAML documents"), "{e}");
        let two_keys = SMALL.replace("kind: Config\n", "kind: Config\nkind: Config\n");
        let e = Kubeconfig::parse(two_keys.as_bytes()).unwrap_err().0;
        assert!(e.contains("duplicate"), "{e}");
        assert_eq!(
            file_under_root("etc/kubernetes/admin.conf", "pki/a.crt"),
            "etc/kubernetes/pki/a.crt"
        );
        assert_eq!(
            file_under_root("etc/kubernetes/kubelet.conf", "/var/lib/kubelet/pki/x.pem"),
            "var/lib/kubelet/pki/x.pem"
        );
        assert_eq!(file_under_root("admin.conf", "a.crt"), "a.crt");
    }

    #[test]
    fn file_credentials_are_reported_not_replaced() {
        let yaml = "apiVersion: v1\nclusters:\n- cluster:\n    server: https://x\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\nkind: Config\nusers:\n- name: default-auth\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n";
        let mut kc = Kubeconfig::parse(yaml.as_bytes()).unwrap();
        let c = kc.credentials().unwrap();
        assert_eq!(
            c.client_certificate,
            Source::File("/var/lib/kubelet/pki/kubelet-client-current.pem".into())
        );
        assert!(kc.replace_credentials(b"a", b"b", b"c").is_err());
        assert!(Kubeconfig::parse(b"[1,2]").is_err());
        assert!(
            Kubeconfig::parse(b"current-context: x\n")
                .unwrap()
                .credentials()
                .is_err()
        );
    }
}
