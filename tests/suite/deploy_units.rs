//! The shipped systemd units (`deploy/systemd/`) pass `systemd-analyze verify` — every directive known, every
//! value valid, the command found and executable — with the binary this build made in place of
//! `/usr/local/bin/existence-gate`. Skipped with a note where `systemd-analyze` is not installed, and required
//! where `EXISTENCE_GATE_REQUIRE_SYSTEMD_ANALYZE` is set (CI, wherever Debian's systemd installs).

use std::process::Command;

#[test]
fn the_systemd_units_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("EXISTENCE_GATE_REQUIRE_SYSTEMD_ANALYZE").is_none(),
            "systemd-analyze is required (EXISTENCE_GATE_REQUIRE_SYSTEMD_ANALYZE) but not installed: apt-get install systemd"
        );
        eprintln!("note: systemd-analyze is not installed (apt-get install systemd); the units' check is skipped");
        return;
    }
    let shipped = crate::common::workspace_root().join("deploy/systemd");
    let dir = tempfile::tempdir().unwrap();
    let binary = crate::common::binary::path();
    let mut units = Vec::new();
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("ExecStart=/usr/local/bin/existence-gate "),
            "{} runs the binary from /usr/local/bin",
            path.display()
        );
        let here = dir.path().join(path.file_name().unwrap());
        let text = text.replace(
            "/usr/local/bin/existence-gate",
            &binary.display().to_string(),
        );
        std::fs::write(&here, text).unwrap();
        units.push(here);
    }
    assert_eq!(units.len(), 2, "the gate's and the feed's units");
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .unwrap();
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
