//! `certrotor demo`: the main job on a built-in example, start to finish, in a temporary folder.

use crate::cli::{Failure, check_exit_code};
use crate::clock::{self, DAY};
use crate::inventory;
use crate::lab::{self, LabLayout, LabOptions, Topology};
use crate::ops::{self, WriteOptions};
use crate::pki::KeyAlgorithm;
use crate::renew::Policy;
use crate::report;

/// Runs the demo; removes the lab node afterwards unless `keep`.
pub fn run(keep: bool) -> Result<u8, Failure> {
    let dir = std::env::temp_dir().join(format!(
        "certrotor-demo-{}-{}",
        std::process::id(),
        clock::now()
    ));
    let result = story(&dir);
    if keep {
        println!("\nThe lab node is kept at {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn story(dir: &std::path::Path) -> Result<u8, Failure> {
    let now = clock::now();
    let opts = LabOptions {
        layout: LabLayout::Bottlerocket,
        topology: Topology::Stacked,
        expires_in: 3 * DAY,
        key_algorithm: KeyAlgorithm::Rsa(2048),
        node_name: "demo-cp-1".into(),
        advertise_address: [10, 0, 0, 10].into(),
        cluster_name: "kubernetes".into(),
        port_offset: 0,
        now,
    };
    println!("1. A Bottlerocket control-plane node whose certificates expire in 3 days");
    println!(
        "   (certrotor lab init {} --layout bottlerocket --expires-in 3d)\n",
        dir.display()
    );
    lab::init(dir, &opts).map_err(|e| Failure::failed(e.to_string()))?;
    println!("2. certrotor check --root {}\n", dir.display());
    let inv = inventory::take(dir, now, 30 * DAY);
    print!("{}", report::table(&inv));
    println!(
        "\n   check exits {} (1: something expires within 30 days).",
        check_exit_code(&inv)
    );
    let policy = Policy {
        within: 90 * DAY,
        all: false,
        names: vec![],
        reuse_keys: false,
        validity: clock::YEAR,
        allow_beyond_ca: false,
    };
    println!(
        "\n3. certrotor renew --root {}   (what is due within 90 days, in one transaction)\n",
        dir.display()
    );
    let report = ops::renew(dir, &policy, false, &WriteOptions::default())?;
    for item in &report.plan.items {
        println!(
            "   renewed {:<26} signer {:<15} ({})",
            item.name, item.signer, item.description
        );
    }
    for skip in &report.plan.skipped {
        println!("   skipped {:<26} {}", skip.name, skip.why);
    }
    println!(
        "\n   {} certificates in {} ms with new keys, valid {} .. {}; backup {}",
        report.plan.items.len(),
        report.duration_ms,
        report.plan.not_before,
        report.plan.not_after,
        report.backup_id.as_deref().unwrap_or("-")
    );
    println!(
        "\n4. certrotor check --root {}   (residual times jump to a year)\n",
        dir.display()
    );
    let after = inventory::take(dir, clock::now(), 30 * DAY);
    print!("{}", report::table(&after));
    println!(
        "\n   check exits {}. kubelet.conf is left alone: the kubelet rotates its own client certificate.",
        check_exit_code(&after)
    );
    Ok(0)
}
