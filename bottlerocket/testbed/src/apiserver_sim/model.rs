//! The emulator's data model: a subset of Bottlerocket's `Settings`, validated the way the real
//! API server's serde-derived model validates it, plus datastore key names.
//!
//! Bottlerocket's model structs are `#[serde(deny_unknown_fields, rename_all = "kebab-case")]`
//! with every field an `Option` (bottlerocket-api.md §1.1). Parsing through a schema-driven
//! `DeserializeSeed` on serde_json reproduces serde's own error texts, line and column included:
//! ``unknown field `xx`, expected one of `motd`, `kubernetes`, ...``,
//! ``invalid type: string "yes", expected a boolean``, ``duplicate field `motd` ``.
//!
//! Where it differs: only the settings listed in [`SETTINGS`] exist; modeled string types
//! (URLs, label keys, IPs, tokens) are plain strings; `Identifier` map keys accept ASCII
//! alphanumerics and `-` (believed to match Bottlerocket; message approximated); base64 values
//! are checked for syntax only (a PEM bundle in `pki.*.data` is not parsed).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// The shape of one setting or group of settings.
#[derive(Debug)]
pub(crate) enum Schema {
    /// A model struct; every field optional, unknown fields rejected.
    Struct {
        name: &'static str,
        fields: &'static [&'static str],
        types: &'static [Schema],
    },
    /// A map with user-chosen names (static pods, host containers, labels).
    Map {
        keys: KeyRule,
        value: &'static Schema,
    },
    /// A list, stored as one datastore value.
    List(&'static Schema),
    String,
    Bool,
    /// A `ValidBase64` string.
    Base64,
    /// A unit-variant enum serialized as one of these strings.
    Enum(&'static [&'static str]),
}

/// What a map key must look like.
#[derive(Debug)]
pub(crate) enum KeyRule {
    /// Bottlerocket's `Identifier` (names of static pods, host containers, ...).
    Identifier,
    /// Any string (Kubernetes label and taint keys; not validated here).
    Any,
}

/// The modeled subset of `Settings` (the top level of `GET /settings`).
pub(crate) static SETTINGS: Schema = Schema::Struct {
    name: "Settings",
    fields: &[
        "motd",
        "kubernetes",
        "host-containers",
        "bootstrap-containers",
        "pki",
    ],
    types: &[
        Schema::String,
        KUBERNETES,
        Schema::Map {
            keys: KeyRule::Identifier,
            value: &HOST_CONTAINER,
        },
        Schema::Map {
            keys: KeyRule::Identifier,
            value: &BOOTSTRAP_CONTAINER,
        },
        Schema::Map {
            keys: KeyRule::Identifier,
            value: &PKI,
        },
    ],
};

const KUBERNETES: Schema = Schema::Struct {
    name: "KubernetesSettings",
    fields: &[
        "cluster-name",
        "api-server",
        "cluster-certificate",
        "bootstrap-token",
        "authentication-mode",
        "standalone-mode",
        "server-tls-bootstrap",
        "server-certificate",
        "server-key",
        "cluster-dns-ip",
        "pod-infra-container-image",
        "provider-id",
        "node-labels",
        "node-taints",
        "static-pods",
        // Bottlerocket 1.46+ (PR #4628): false gives the kubelet no static pod folder.
        "static-pods-enabled",
    ],
    types: &[
        Schema::String,
        Schema::String,
        Schema::Base64,
        Schema::String,
        Schema::Enum(&["aws", "tls"]),
        Schema::Bool,
        Schema::Bool,
        Schema::Base64,
        Schema::Base64,
        Schema::String,
        Schema::String,
        Schema::String,
        Schema::Map {
            keys: KeyRule::Any,
            value: &Schema::String,
        },
        Schema::Map {
            keys: KeyRule::Any,
            value: &Schema::List(&Schema::String),
        },
        Schema::Map {
            keys: KeyRule::Identifier,
            value: &STATIC_POD,
        },
        Schema::Bool,
    ],
};

const STATIC_POD: Schema = Schema::Struct {
    name: "StaticPod",
    fields: &["manifest", "enabled"],
    types: &[Schema::Base64, Schema::Bool],
};

const HOST_CONTAINER: Schema = Schema::Struct {
    name: "HostContainer",
    fields: &["source", "enabled", "superpowered", "user-data"],
    types: &[Schema::String, Schema::Bool, Schema::Bool, Schema::Base64],
};

const BOOTSTRAP_CONTAINER: Schema = Schema::Struct {
    name: "BootstrapContainer",
    fields: &["source", "mode", "essential", "user-data"],
    types: &[
        Schema::String,
        Schema::Enum(&["always", "once", "off"]),
        Schema::Bool,
        Schema::Base64,
    ],
};

const PKI: Schema = Schema::Struct {
    name: "PemCertificate",
    fields: &["data", "trusted"],
    types: &[Schema::Base64, Schema::Bool],
};

/// Parses a JSON request body as partial `Settings`. Errors carry serde_json's text (with line
/// and column), which the server prefixes as actix does. `null` fields and empty groups are
/// dropped: they write no datastore key.
pub(crate) fn parse_settings(body: &[u8]) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = Seed(&SETTINGS).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(prune(value).unwrap_or_else(empty_object))
}

/// Validates an already-parsed value as partial `Settings` (same rules as [`parse_settings`]).
pub(crate) fn validate_settings(value: &Value) -> Result<Value, serde_json::Error> {
    let value = Seed(&SETTINGS).deserialize(value)?;
    Ok(prune(value).unwrap_or_else(empty_object))
}

/// An empty JSON object.
pub(crate) fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// Deep-merges `patch` into `target`: objects merge key by key, anything else (scalars and
/// lists) replaces the old value, as the datastore stores one value per leaf key.
pub(crate) fn deep_merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (name, value) in patch {
                match target.get_mut(&name) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        deep_merge(existing, value);
                    }
                    _ => {
                        target.insert(name, value);
                    }
                }
            }
        }
        (target, patch) => *target = patch,
    }
}

/// Datastore key names of every leaf under `value`, which lives at key `root`
/// (e.g. `settings`), sorted.
pub(crate) fn leaf_names(root: &str, value: &Value) -> Vec<String> {
    let mut names = Vec::new();
    collect_leaf_names(root, value, &mut names);
    names.sort();
    names
}

/// Every leaf under `value` (which lives at key `root`) with its value, sorted by key name.
pub(crate) fn leaf_pairs(root: &str, value: &Value) -> Vec<(String, Value)> {
    fn collect(name: &str, value: &Value, out: &mut Vec<(String, Value)>) {
        match value {
            Value::Object(map) => {
                for (segment, child) in map {
                    collect(&join_key(name, segment), child, out);
                }
            }
            leaf => out.push((name.to_string(), leaf.clone())),
        }
    }
    let mut pairs = Vec::new();
    collect(root, value, &mut pairs);
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
}

/// The part of `value` (living at key `root`) whose leaf key names satisfy `keep`; `None` if
/// nothing matches.
pub(crate) fn filter_leaves(
    root: &str,
    value: &Value,
    keep: &dyn Fn(&str) -> bool,
) -> Option<Value> {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (name, child) in map {
                if let Some(kept) = filter_leaves(&join_key(root, name), child, keep) {
                    out.insert(name.clone(), kept);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        leaf => keep(root).then(|| leaf.clone()),
    }
}

/// Appends one segment to a key name, double-quoting it unless it consists only of
/// `[A-Za-z0-9_/-]` (datastore key syntax, bottlerocket-api.md §1.4).
pub(crate) fn join_key(prefix: &str, segment: &str) -> String {
    let plain = !segment.is_empty()
        && segment
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'/' | b'-'));
    let segment = if plain {
        segment.to_string()
    } else {
        format!("\"{segment}\"")
    };
    if prefix.is_empty() {
        segment
    } else {
        format!("{prefix}.{segment}")
    }
}

/// Splits a key name into segments, honouring double-quoted segments; `Err` explains why the
/// name is invalid.
pub(crate) fn split_key(name: &str) -> Result<Vec<String>, String> {
    if name.is_empty() || name.len() > MAX_KEY_LENGTH {
        return Err(format!(
            "key length must be 1 to {MAX_KEY_LENGTH} characters"
        ));
    }
    let mut segments = Vec::new();
    let mut rest = name;
    loop {
        let (segment, after) = if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted
                .find('"')
                .ok_or_else(|| "unbalanced quotes".to_string())?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = rest.find('.').unwrap_or(rest.len());
            let segment = &rest[..end];
            if let Some(byte) = segment
                .bytes()
                .find(|byte| !(byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'/' | b'-')))
            {
                return Err(format!("invalid character '{}'", char::from(byte)));
            }
            (segment, &rest[end..])
        };
        if segment.is_empty() {
            return Err("empty segment".to_string());
        }
        segments.push(segment.to_string());
        match after.strip_prefix('.') {
            Some(next) => rest = next,
            None if after.is_empty() => return Ok(segments),
            None => return Err("quoted segment must be followed by '.'".to_string()),
        }
    }
}

/// Longest datastore key name (bottlerocket-api.md §1.4).
const MAX_KEY_LENGTH: usize = 255;

fn collect_leaf_names(name: &str, value: &Value, names: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (segment, child) in map {
                collect_leaf_names(&join_key(name, segment), child, names);
            }
        }
        _ => names.push(name.to_string()),
    }
}

/// Drops empty objects (a group with nothing set writes no key); `None` if nothing is left.
fn prune(value: Value) -> Option<Value> {
    match value {
        Value::Object(map) => {
            let map: Map<String, Value> = map
                .into_iter()
                .filter_map(|(name, child)| prune(child).map(|child| (name, child)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        other => Some(other),
    }
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
}

// === impl Seed: schema-driven deserialization ===

struct Seed(&'static Schema);

impl<'de> DeserializeSeed<'de> for Seed {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self.0 {
            Schema::Struct { name, fields, .. } => {
                deserializer.deserialize_struct(name, fields, StructVisitor(self.0))
            }
            Schema::Map { .. } => deserializer.deserialize_map(MapVisitor(self.0)),
            Schema::List(item) => deserializer.deserialize_seq(ListVisitor(item)),
            Schema::Bool => deserializer.deserialize_bool(BoolVisitor),
            Schema::String | Schema::Base64 | Schema::Enum(_) => {
                deserializer.deserialize_string(StringVisitor(self.0))
            }
        }
    }
}

/// A struct field: `null` (or absent) means "not set".
struct OptionalSeed(&'static Schema);

impl<'de> DeserializeSeed<'de> for OptionalSeed {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(OptionalVisitor(self.0))
    }
}

struct OptionalVisitor(&'static Schema);

impl<'de> Visitor<'de> for OptionalVisitor {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("option")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        Seed(self.0).deserialize(deserializer).map(Some)
    }
}

struct StructVisitor(&'static Schema);

impl<'de> Visitor<'de> for StructVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Schema::Struct { name, .. } => write!(f, "struct {name}"),
            _ => f.write_str("a struct"),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Schema::Struct { fields, types, .. } = self.0 else {
            return Err(de::Error::custom("schema error: not a struct"));
        };
        let mut seen = vec![false; fields.len()];
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Some(index) = fields.iter().position(|field| *field == key) else {
                return Err(de::Error::unknown_field(&key, fields));
            };
            if std::mem::replace(&mut seen[index], true) {
                return Err(de::Error::duplicate_field(fields[index]));
            }
            if let Some(value) = map.next_value_seed(OptionalSeed(&types[index]))? {
                out.insert(key, value);
            }
        }
        Ok(Value::Object(out))
    }
}

struct MapVisitor(&'static Schema);

impl<'de> Visitor<'de> for MapVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Schema::Map { keys, value } = self.0 else {
            return Err(de::Error::custom("schema error: not a map"));
        };
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if matches!(keys, KeyRule::Identifier) && !is_identifier(&key) {
                return Err(de::Error::custom(format!(
                    "Invalid identifier '{key}': must only contain ASCII alphanumerics and hyphens"
                )));
            }
            let child = map.next_value_seed(Seed(value))?;
            out.insert(key, child);
        }
        Ok(Value::Object(out))
    }
}

struct ListVisitor(&'static Schema);

impl<'de> Visitor<'de> for ListVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element_seed(Seed(self.0))? {
            out.push(item);
        }
        Ok(Value::Array(out))
    }
}

struct BoolVisitor;

impl Visitor<'_> for BoolVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a boolean")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }
}

struct StringVisitor(&'static Schema);

impl Visitor<'_> for StringVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
        match self.0 {
            Schema::Base64 => {
                if let Err(source) = crate::base64::decode(value) {
                    return Err(E::custom(format!("Invalid base64 input: {source}")));
                }
            }
            Schema::Enum(variants) if !variants.contains(&value) => {
                return Err(E::unknown_variant(value, variants));
            }
            _ => {}
        }
        Ok(Value::String(value.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check_error(body: &str, expected: &str) {
        let error = parse_settings(body.as_bytes()).expect_err(body);
        assert_eq!(error.to_string(), expected, "for {body}");
    }

    #[test]
    fn accepts_modeled_settings_and_drops_nulls_and_empty_groups() {
        let body = r#"{"motd":"hi","kubernetes":{"static-pods":{"etcd":{"manifest":"Zm9v",
            "enabled":true}},"node-labels":{"node-role.kubernetes.io/control-plane":""},
            "api-server":null,"node-taints":{"a":["b:NoSchedule"]}},"pki":{}}"#;
        let value = parse_settings(body.as_bytes()).expect("valid");
        assert_eq!(
            value,
            json!({"motd":"hi","kubernetes":{"static-pods":{"etcd":{"manifest":"Zm9v","enabled":true}},
                "node-labels":{"node-role.kubernetes.io/control-plane":""},
                "node-taints":{"a":["b:NoSchedule"]}}})
        );
        assert_eq!(parse_settings(b"{}").expect("empty"), json!({}));
    }

    #[test]
    fn errors_read_like_serde_derive() {
        check_error(
            r#"{"xx": 1}"#,
            "unknown field `xx`, expected one of `motd`, `kubernetes`, `host-containers`, \
             `bootstrap-containers`, `pki` at line 1 column 5",
        );
        check_error(
            r#"{"kubernetes":{"static-pods":{"etcd":{"enabeld":true}}}}"#,
            "unknown field `enabeld`, expected `manifest` or `enabled` at line 1 column 47",
        );
        check_error(
            r#"{"kubernetes":{"static-pods":{"etcd":{"enabled":"yes"}}}}"#,
            "invalid type: string \"yes\", expected a boolean at line 1 column 53",
        );
        check_error(
            r#"{"kubernetes":{"static-pods":{"etcd":{"manifest":"!!"}}}}"#,
            "Invalid base64 input: invalid Base64 encoding at line 1 column 53",
        );
        check_error(
            r#"{"kubernetes":{"static-pods":{"a.b":{}}}}"#,
            "Invalid identifier 'a.b': must only contain ASCII alphanumerics and hyphens \
             at line 1 column 35",
        );
        check_error(
            r#"{"bootstrap-containers":{"x":{"mode":"sometimes"}}}"#,
            "unknown variant `sometimes`, expected one of `always`, `once`, `off` at line 1 column 48",
        );
        check_error(
            r#"{"motd":"a","motd":"b"}"#,
            "duplicate field `motd` at line 1 column 18",
        );
        check_error(
            "null",
            "invalid type: null, expected struct Settings at line 1 column 4",
        );
        check_error("{", "EOF while parsing an object at line 1 column 1");
        check_error("{} x", "trailing characters at line 1 column 4");
        check_error(
            r#"{"kubernetes":{"static-pods":{"etcd":null}}}"#,
            "invalid type: null, expected struct StaticPod at line 1 column 41",
        );
    }

    #[test]
    fn validates_values_without_positions() {
        let error = validate_settings(&json!({"motd": 5})).expect_err("not a string");
        assert_eq!(
            error.to_string(),
            "invalid type: integer `5`, expected a string"
        );
    }

    #[test]
    fn merges_and_names_leaves() {
        let mut live = json!({"motd":"a","kubernetes":{"node-labels":{"x":"1"},"node-taints":{"t":["a","b"]}}});
        deep_merge(
            &mut live,
            json!({"kubernetes":{"node-labels":{"y.z":"2"},"node-taints":{"t":["c"]}}}),
        );
        assert_eq!(
            live,
            json!({"motd":"a","kubernetes":{"node-labels":{"x":"1","y.z":"2"},"node-taints":{"t":["c"]}}})
        );
        assert_eq!(
            leaf_names("settings", &live),
            [
                "settings.kubernetes.node-labels.\"y.z\"",
                "settings.kubernetes.node-labels.x",
                "settings.kubernetes.node-taints.t",
                "settings.motd",
            ]
        );
        let kept = filter_leaves("settings", &live, &|name| {
            name.starts_with("settings.kubernetes.node-l")
        });
        assert_eq!(
            kept,
            Some(json!({"kubernetes":{"node-labels":{"x":"1","y.z":"2"}}}))
        );
        assert_eq!(filter_leaves("settings", &live, &|_| false), None);
        assert_eq!(
            leaf_pairs(
                "settings",
                &json!({"motd": "a", "kubernetes": {"static-pods": {"etcd": {"enabled": true}}}})
            ),
            [
                (
                    "settings.kubernetes.static-pods.etcd.enabled".to_string(),
                    json!(true)
                ),
                ("settings.motd".to_string(), json!("a")),
            ]
        );
    }

    #[test]
    fn splits_key_names() {
        let ok = |name: &str, segments: &[&str]| {
            assert_eq!(split_key(name).expect(name), segments);
        };
        ok("settings.motd", &["settings", "motd"]);
        ok(
            "settings.kubernetes.node-labels.\"a.b/c\"",
            &["settings", "kubernetes", "node-labels", "a.b/c"],
        );
        for bad in ["", "a..b", "a.", "\"a", "a b", "\"a\"b"] {
            assert!(split_key(bad).is_err(), "accepted {bad:?}");
        }
        assert_eq!(join_key("settings", "a.b"), "settings.\"a.b\"");
        assert_eq!(join_key("", "motd"), "motd");
    }
}
