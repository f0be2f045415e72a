//! `certrotor demo`: the main job on a built-in example, start to finish, in a temporary folder.

use std::fmt;

use crate::lab::{self, LabLayout, LabOptions, Topology};
use crate::node::Node;
use crate::node::inventory::{self, Status};
use crate::output::report;
use crate::pass::ops::{self, WriteOptions};
use crate::pass::outcome;
use crate::pki::KeyAlgorithm;
use crate::renew::Policy;
use crate::sys::clock::{DAY, SharedClock, YEAR};

/// Why the demo stopped.
#[derive(Debug)]
pub enum DemoError {
    /// Writing the lab node failed.
    Lab(lab::LabError),
    /// The renewal failed.
    Renew(ops::OpsError),
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Lab(e) => write!(f, "the demo's lab node: {e}"),
            DemoError::Renew(e) => write!(f, "the demo's renewal: {e}"),
        }
    }
}

impl std::error::Error for DemoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DemoError::Lab(e) => Some(e),
            DemoError::Renew(e) => Some(e),
        }
    }
}

/// Runs the demo at the time `clock` says; removes the lab node afterwards unless `keep`.
pub fn run(keep: bool, clock: &SharedClock) -> Result<(), DemoError> {
    let dir = std::env::temp_dir().join(format!(
        "certrotor-demo-{}-{}",
        std::process::id(),
        clock.now()
    ));
    let result = story(&dir, clock);
    if keep {
        println!("\nThe lab node is kept at {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn story(dir: &std::path::Path, clock: &SharedClock) -> Result<(), DemoError> {
    let now = clock.now();
    let opts = LabOptions {
        layout: LabLayout::Bottlerocket,
        topology: Topology::Stacked,
        expires_in: 3 * DAY,
        key_algorithm: KeyAlgorithm::Rsa(2048),
        node_name: "demo-cp-1".into(),
        advertise_address: [10, 0, 0, 10].into(),
        cluster_name: "kubernetes".into(),
        port_offset: 0,
        kubernetes_version: lab::manifests::DEFAULT_KUBERNETES_VERSION,
        now,
    };
    println!("1. A Bottlerocket control-plane node whose certificates expire in 3 days");
    println!(
        "   (certrotor lab init {} --layout bottlerocket --expires-in 3d)\n",
        dir.display()
    );
    lab::init(dir, &opts).map_err(DemoError::Lab)?;
    println!("2. certrotor check --root {}\n", dir.display());
    // Found after `lab init` made the node's files; renewing below keeps the same files.
    let node = Node::discover(dir);
    let inv = inventory::take(&node, now, 30 * DAY);
    print!("{}", report::table(&inv));
    println!(
        "\n   check exits {} (1: something expires within 30 days).",
        outcome::for_inventory(&inv)
    );
    let policy = Policy {
        within: 90 * DAY,
        all: false,
        names: vec![],
        reuse_keys: false,
        validity: YEAR,
        allow_beyond_ca: false,
    };
    println!(
        "\n3. certrotor renew --root {}   (what is due within 90 days, in one transaction)\n",
        dir.display()
    );
    let report = ops::renew(dir, &policy, false, &WriteOptions::new(clock.clone()))
        .map_err(DemoError::Renew)?;
    for item in &report.plan.items {
        println!(
            "   renewed {:<26} signer {:<15} ({})",
            item.name, item.signer, item.description
        );
    }
    for skip in &report.plan.skipped {
        println!("   skipped {:<26} {}", skip.name, skip.why);
    }
    for line in crate::renew::kubelet::plan_text(&report.kubelet, false).lines() {
        println!("   {}", line.trim_start());
    }
    println!(
        "\n   {} certificates in {} ms with new keys, valid {} .. {}; backup {}",
        report.plan.items.len() + usize::from(report.kubelet.client.is_some()),
        report.duration_ms,
        report.plan.not_before,
        report.plan.not_after,
        report.backup_id.as_deref().unwrap_or("-")
    );
    println!(
        "\n4. certrotor check --root {}   (residual times jump to a year)\n",
        dir.display()
    );
    let after = inventory::take(&node, clock.now(), 30 * DAY);
    print!("{}", report::table(&after));
    println!("\n   check exits {}.", outcome::for_inventory(&after));
    for cert in after.certificates.iter().filter(|c| c.status != Status::Ok) {
        println!(
            "   {} is {}: {}",
            cert.name,
            format!("{:?}", cert.status).to_lowercase(),
            still_due_why(&cert.name)
        );
    }
    Ok(())
}

/// Why a certificate is still due after the demo's renewal.
fn still_due_why(name: &str) -> &'static str {
    match name {
        crate::node::kubelet::SERVING => {
            "the kubelet's self-signed serving certificate (no CA signs it, nothing verifies \
             it); certrotor leaves one that is only due, and once it has expired `renew` \
             removes it and the kubelet writes a new one when it next starts (on Bottlerocket \
             the bootstrap container runs before the kubelet at every boot)"
        }
        _ => "not renewed by this pass; `certrotor renew --dry-run` says why",
    }
}
