//! The library's house rules (ARCHITECTURE.md, "Code map"): a stage folder imports only from
//! itself and from the stages before it in data-flow order, and the library never imports its
//! CLI. Read from the sources, so that a new import that breaks the order fails here.

use std::path::{Path, PathBuf};

/// The stages in the order data flows, as ARCHITECTURE.md lists them.
const STAGES: &[&str] = &[
    "sys", "pki", "node", "txn", "renew", "restart", "cluster", "pass", "ca", "output", "lab",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The stages a source names as `crate::<stage>`, including inside `use crate::{a, b::c}`.
fn stages_named(source: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|part| part.trim().split("::").next().unwrap_or("").trim())
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            vec![&rest[..end]]
        };
        for name in names {
            if let Some(stage) = STAGES.iter().find(|s| **s == name) {
                found.push(*stage);
            }
        }
    }
    found
}

/// The source without its unit tests (a file's `#[cfg(test)] mod …` at the end), which may use
/// the lab to build their inputs.
fn shipped_part(source: &str) -> &str {
    source
        .find("\n#[cfg(test)]\nmod ")
        .map_or(source, |at| &source[..at])
}

#[test]
fn every_stage_imports_only_from_itself_and_the_stages_before_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    let mut checked = 0;
    for (rank, stage) in STAGES.iter().enumerate() {
        let mut files = Vec::new();
        rust_files(&src.join(stage), &mut files);
        assert!(!files.is_empty(), "no sources in agent/src/{stage}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            checked += 1;
            for named in stages_named(shipped_part(&text)) {
                let named_rank = STAGES.iter().position(|s| *s == named).unwrap();
                if named_rank > rank {
                    broken.push(format!("{}: imports {named}", file.display()));
                }
            }
        }
    }
    assert!(checked > 40, "only {checked} files read");
    assert!(
        broken.is_empty(),
        "imports against the stage order:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_stage_rule_catches_a_late_import() {
    assert_eq!(stages_named("use crate::pass::run;"), ["pass"]);
    assert_eq!(
        stages_named("use crate::{node::catalog, txn::{self, Txn}};"),
        ["node", "txn"]
    );
    assert_eq!(stages_named("crate::output::logging::x()"), ["output"]);
    assert!(stages_named("crate::core_tests").is_empty());
}

#[test]
fn the_library_never_imports_its_cli() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let bin = src.join("bin");
    for file in files.iter().filter(|f| !f.starts_with(&bin)) {
        let text = std::fs::read_to_string(file).unwrap();
        for cli in ["bin::certrotor", "certrotor::bin", "mod commands", "argh::"] {
            assert!(!text.contains(cli), "{} names {cli}", file.display());
        }
    }
}
