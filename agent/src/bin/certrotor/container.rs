//! The command line of a Bottlerocket host or bootstrap container, which cannot be given
//! arguments: the words of its user-data file.

use std::path::Path;

/// Where Bottlerocket mounts a bootstrap container's own folder.
pub const BOOTSTRAP_CONTAINER_DIR: &str = "/.bottlerocket/bootstrap-containers/current";
/// Where Bottlerocket mounts a host container's own folder.
pub const HOST_CONTAINER_DIR: &str = "/.bottlerocket/host-containers/current";

/// The command line of a Bottlerocket container, which cannot be given arguments: the words of
/// its user-data file (`#` starts a comment), or by default `run --once --platform none` for a bootstrap
/// container and `daemon` for a host container. `None` outside such a container.
pub fn container_args(bootstrap_dir: &Path, host_dir: &Path) -> Option<Vec<String>> {
    for (dir, default) in [
        (bootstrap_dir, "run --once --platform none"),
        (host_dir, "daemon"),
    ] {
        if !dir.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(dir.join("user-data")).unwrap_or_default();
        let words: Vec<String> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .flat_map(str::split_whitespace)
            .map(str::to_string)
            .collect();
        return Some(if words.is_empty() {
            default.split(' ').map(str::to_string).collect()
        } else {
            words
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_user_data_gives_the_command_line() {
        let base = std::env::temp_dir().join(format!("certrotor-cli-ud-{}", std::process::id()));
        let (boot, host) = (base.join("boot"), base.join("host"));
        let _ = std::fs::remove_dir_all(&base);
        assert_eq!(container_args(&boot, &host), None);
        std::fs::create_dir_all(&host).unwrap();
        assert_eq!(
            container_args(&boot, &host),
            Some(vec!["daemon".to_string()])
        );
        std::fs::write(
            host.join("user-data"),
            "# comment\ndaemon --interval 6h # twice a day\n  --within 60d\n",
        )
        .unwrap();
        let got = container_args(&boot, &host).unwrap();
        assert_eq!(got, ["daemon", "--interval", "6h", "--within", "60d"]);
        std::fs::create_dir_all(&boot).unwrap();
        assert_eq!(
            container_args(&boot, &host).unwrap(),
            ["run", "--once", "--platform", "none"]
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
