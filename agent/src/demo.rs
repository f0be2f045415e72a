//! `certrotor demo`: the main job on a built-in example, start to finish, in a temporary folder.

use std::path::PathBuf;

use crate::cli::{Failure, check_exit_code};
use crate::clock::{self, DAY};
use crate::inventory;
use crate::lab::{self, LabLayout, LabOptions, Topology};
use crate::pki::KeyAlgorithm;
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

fn story(dir: &PathBuf) -> Result<u8, Failure> {
    let now = clock::now();
    let opts = LabOptions {
        layout: LabLayout::Bottlerocket,
        topology: Topology::Stacked,
        expires_in: 3 * DAY,
        key_algorithm: KeyAlgorithm::Rsa(2048),
        node_name: "demo-cp-1".into(),
        advertise_address: [10, 0, 0, 10].into(),
        cluster_name: "kubernetes".into(),
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
    let due: Vec<&str> = inv
        .certificates
        .iter()
        .filter(|r| r.renewable && r.residual_seconds.is_some_and(|s| s < 90 * DAY))
        .map(|r| r.name.as_str())
        .collect();
    println!(
        "\n3. Renewal will re-issue {} certificates and kubeconfigs: {}",
        due.len(),
        due.join(", ")
    );
    Ok(0)
}
