use std::time::Duration;

use super::*;
use crate::filter::{Retention, MAX_LAYER_BYTES};

#[test]
fn empty_config_has_the_default_namespace_with_documented_defaults() {
    let config = GateConfig::from_toml("").unwrap();
    let default = &config.namespaces[DEFAULT_NAMESPACE];
    assert_eq!(default, &NamespaceSettings::default());
    assert_eq!(default.expected_keys, 10_000_000);
    assert_eq!(config.limits.max_batch_keys, 10_000);
    assert_eq!(config.limits.max_key_bytes, 1_024);
    assert_eq!(config.limits.handshake_timeout, Duration::from_secs(30));
}

#[test]
fn namespaces_and_durations_parse() {
    let config = GateConfig::from_toml(
        r#"
        [limits]
        max_batch_keys = 500
        [namespaces.users]
        retention = "7d"
        windows = 8
        missing_ttl = "90s"
        deleted_ttl = "10m"
        max_ttl = "2h"
        "#,
    )
    .unwrap();
    let users = &config.namespaces["users"];
    assert_eq!(users.retention, Retention::Millis(7 * 86_400_000));
    assert_eq!(users.missing_ttl, Duration::from_secs(90));
    assert_eq!(users.max_ttl, Duration::from_secs(7_200));
    assert_eq!(config.limits.max_batch_keys, 500);
    assert!(config.namespaces.contains_key(DEFAULT_NAMESPACE));
}

#[test]
fn errors_name_the_field() {
    let unknown = GateConfig::from_toml("[namespaces.users]\nexpectd_keys = 5").unwrap_err();
    assert!(unknown.to_string().contains("expectd_keys"), "{unknown}");
    let bad_duration =
        GateConfig::from_toml("[namespaces.users]\nmissing_ttl = \"9x\"").unwrap_err();
    assert!(
        bad_duration.to_string().contains("missing_ttl"),
        "{bad_duration}"
    );
    assert!(
        bad_duration.to_string().contains("unknown unit"),
        "{bad_duration}"
    );
    let bad_rate =
        GateConfig::from_toml("[namespaces.users]\nfalse_positive_rate = 2.0").unwrap_err();
    assert!(
        bad_rate
            .to_string()
            .contains("namespaces.users.false_positive_rate"),
        "{bad_rate}"
    );
    let bad_windows =
        GateConfig::from_toml("[namespaces.users]\nretention = \"1d\"\nwindows = 1").unwrap_err();
    assert!(
        bad_windows.to_string().contains("namespaces.users.windows"),
        "{bad_windows}"
    );
    let bad_name = GateConfig::from_toml("[namespaces.\"a b\"]").unwrap_err();
    assert!(
        bad_name.to_string().contains("not a valid name"),
        "{bad_name}"
    );
    let bad_limit = GateConfig::from_toml("[limits]\nmax_batch_keys = 0").unwrap_err();
    assert!(
        bad_limit.to_string().contains("limits.max_batch_keys"),
        "{bad_limit}"
    );
    let bad_handshake =
        GateConfig::from_toml("[limits]\nhandshake_timeout = \"10ms\"").unwrap_err();
    assert!(
        bad_handshake
            .to_string()
            .contains("limits.handshake_timeout"),
        "{bad_handshake}"
    );
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("1w").unwrap(), Duration::from_secs(604_800));
    assert!(parse_duration("10").unwrap_err().contains("no unit"));
    assert!(parse_duration("s").is_err());
}

#[test]
fn the_default_filter_cap_is_eight_times_the_initial_size() {
    let spec = NamespaceSettings::default().filter_spec();
    assert_eq!(spec.max_bytes, spec.initial_bytes() * 8);
}

fn refusal(toml: &str) -> String {
    GateConfig::from_toml(toml).unwrap_err().to_string()
}

#[test]
fn sizes_past_what_a_filter_can_index_are_refused_with_the_real_limit() {
    let huge = refusal("[namespaces.users]\nexpected_keys = 1000000000000");
    assert!(
        huge.contains("namespaces.users.expected_keys") && huge.contains("256 GiB"),
        "{huge}"
    );
    let cap = refusal("[namespaces.users]\nmax_filter_bytes = 300000000000");
    assert!(cap.contains("namespaces.users.max_filter_bytes"), "{cap}");
    // The largest sizing that fits keeps its default growth cap within the limit.
    let config = GateConfig::from_toml("[namespaces.users]\nexpected_keys = 100000000000").unwrap();
    assert!(config.namespaces["users"].filter_spec().max_bytes <= MAX_LAYER_BYTES);
    let tombstones = refusal("[namespaces.users]\nmax_tombstones = 4611686018427387904");
    assert!(
        tombstones.contains("namespaces.users.max_tombstones") && tombstones.contains("2^32"),
        "{tombstones}"
    );
}

#[test]
fn a_configuration_that_does_not_fit_in_memory_names_the_largest_namespace() {
    let config = GateConfig::from_toml(
        "[namespaces.small]\nexpected_keys = 1000\n[namespaces.big]\nexpected_keys = 10000000000",
    )
    .unwrap();
    let needed = config.bytes_at_capacity();
    assert!(needed > 10_000_000_000, "{needed}");
    config.check_fits(needed).unwrap();
    let refused = config.check_fits(8 << 30).unwrap_err().to_string();
    assert!(
        refused.contains("namespaces.big.expected_keys")
            && refused.contains(&needed.to_string())
            && refused.contains(&(8u64 << 30).to_string()),
        "{refused}"
    );
    let tombstones =
        GateConfig::from_toml("[namespaces.t]\nexpected_keys = 1\nmax_tombstones = 1000000000")
            .unwrap();
    let refused = tombstones.check_fits(1 << 30).unwrap_err().to_string();
    assert!(refused.contains("namespaces.t.max_tombstones"), "{refused}");
}

#[test]
fn default_ttls_above_max_ttl_are_refused() {
    let refused = refusal("[namespaces.users]\nmissing_ttl = \"2h\"\nmax_ttl = \"1h\"");
    assert!(
        refused.contains("namespaces.users.missing_ttl") && refused.contains("max_ttl"),
        "{refused}"
    );
    assert!(refusal("[namespaces.users]\ndeleted_ttl = \"2d\"").contains("deleted_ttl"));
}

#[test]
fn names_that_differ_only_in_case_are_refused() {
    let refused = refusal("[namespaces.Users]\n[namespaces.users]");
    assert!(refused.contains("only in case"), "{refused}");
    assert!(refusal("[namespaces.DEFAULT]").contains("only in case"));
    GateConfig::from_toml("[namespaces.users]\n[namespaces.users-v2]").unwrap();
}

#[test]
fn the_replay_buffer_defaults_to_half_the_filter_within_bounds_unless_set() {
    use super::limits::{MAX_DEFAULT_REPLAY_BYTES, MIN_DEFAULT_REPLAY_BYTES};
    let config = GateConfig::from_toml(
        "[namespaces.small]\nexpected_keys = 1000\n[namespaces.mid]\nexpected_keys = 10000000\n\
         [namespaces.big]\nexpected_keys = 1000000000",
    )
    .unwrap();
    let replay = |name: &str| {
        let filter = config.namespaces[name].filter_spec().initial_bytes();
        (filter, config.limits.replay_buffer_bytes_for(filter))
    };
    assert_eq!(replay("small").1, MIN_DEFAULT_REPLAY_BYTES);
    let (filter, mid) = replay("mid");
    assert_eq!(mid as u64, filter / 2);
    assert_eq!(replay("big").1, MAX_DEFAULT_REPLAY_BYTES);

    let set = GateConfig::from_toml("[limits]\nreplay_buffer_bytes = 65536").unwrap();
    assert_eq!(set.limits.replay_buffer_bytes_for(1 << 30), 65_536);
    let refused = GateConfig::from_toml("[limits]\nreplay_buffer_bytes = 100")
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("limits.replay_buffer_bytes") && refused.contains("4096"),
        "{refused}"
    );
}
