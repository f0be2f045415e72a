//! kubeconfig files: read the current-context user's client certificate, and replace it.
//!
//! kubeadm's renewal (`kubeConfigReadWriter`) resolves `current-context` to a cluster and a
//! user, replaces only that user's `client-certificate-data` and `client-key-data`, and
//! refreshes the cluster's `certificate-authority-data` from `pki/ca.crt`. certrotor does the
//! same on the parsed document and keeps every other key and its order. Comments are not kept
//! (kubeadm does not keep them either).

use std::fmt;

use serde_norway::{Mapping, Value};

use crate::sys::message_error::message_error;

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

message_error!(
    /// A kubeconfig problem, with what to do about it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    KubeconfigError
);

fn err(msg: impl Into<String>) -> KubeconfigError {
    KubeconfigError(msg.into())
}

mod shape;
pub use shape::{
    MAX_YAML_ALIASES, MAX_YAML_FLOW_DEPTH, MAX_YAML_INDENT, MAX_YAML_LINE_INDICATORS,
    check_yaml_shape, shape_scan,
};

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

    /// Replaces the current cluster's `certificate-authority-data` with `ca_pem` (a CA
    /// rotation's trust bundle); everything else is kept. Refuses a cluster whose CA is a file
    /// path or absent: certrotor changes embedded data only.
    pub fn replace_ca_data(&mut self, ca_pem: &[u8]) -> Result<(), KubeconfigError> {
        let (_, cluster_name) = self.current()?;
        if !matches!(
            self.credentials()?.certificate_authority,
            Some(Source::Embedded(_))
        ) {
            return Err(err(format!(
                "cluster '{cluster_name}' does not embed its certificate-authority-data"
            )));
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

mod fast;

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
mod tests;
