//! docs/configuration.md against the code it documents: every flag of every command and every key of the
//! configuration file, in both directions, so that neither an option added to the code nor one removed from
//! it leaves the reference wrong without a test failing.
//!
//! Where each thing must be documented, as the docs are organised: docs/configuration.md is the reference
//! for every flag, the client commands' included (docs/cli.md says what those commands do and sends the
//! reader to configuration.md for their flags), and for every key of the file.
//!
//! - **Flags.** The binary's own `--help` is the list: `existence-gate --help` names the commands, each
//!   command's `--help` its flags (and, for `replicas`, its subcommands), walked recursively. Each flag must
//!   appear in a code span (`` `--name` ``, `` `--batch N` ``, `` `existence-gate --version` ``) in the part
//!   of configuration.md about that command: its own `##` section (`serve`, `probe`, `hash-token`, `feed`),
//!   or its row of the client commands' table; the connection flags' table counts for the client commands
//!   and `feed`, and the text above the first `##` for the top-level command. Per command, not anywhere in
//!   the file, because most of the client commands share flags (`--json`, `--batch`, `--namespace`): a flag
//!   added to one command is only documented when that command's part names it. `--help` itself is left
//!   out: clap gives it to every command. The other way, every `--flag` in a code span of configuration.md
//!   or docs/cli.md must be a flag of some command, so a removed one does not linger there.
//! - **Keys.** The configuration structs (`crates/core/src/config/`) only implement `Deserialize`, so there
//!   is no default configuration to serialise. Instead of a hand-written list, the test asks the parser:
//!   `GateConfig::from_toml` (what `serve --config` calls) fed a table with an unknown key refuses it and
//!   names every key that table accepts (serde's derived `unknown field ..., expected one of ...`, which
//!   lists the field names after any `rename`). The list thus comes from the code through the parser itself,
//!   and the refusal proves the table has `deny_unknown_fields`, without which a misspelt key would be
//!   silently ignored (the reference promises a startup error). Were that message ever worded otherwise,
//!   the test fails saying it cannot read it, never passes on an empty list. Which Rust type backs each table
//!   is not needed; the tables themselves are ([`TABLES`]), and the top level's own list must be exactly
//!   them, so a new table fails until it has a line in `TABLES` and a section in the reference. Each table's
//!   keys must be the rows of its section's table in configuration.md, and the example file there must show
//!   each key (set, or commented out where it has no fixed default) and no other; its values, read by the
//!   same parser, must be the defaults, as the reference says they are.

use std::collections::BTreeSet;
use std::process::Command;

use existence_gate::core::config::{GateConfig, Limits, Mirrors, NamespaceSettings};

/// The configuration reference.
const REFERENCE: &str = "docs/configuration.md";
/// The command-line tools' page.
const CLI_PAGE: &str = "docs/cli.md";

/// The configuration file's tables: the top-level key, a line of TOML that opens one (where an unknown key
/// is tried), and the heading of the reference's section whose table lists its keys.
const TABLES: [(&str, &str, &str); 4] = [
    ("limits", "[limits]", "### `[limits]`"),
    ("mirrors", "[mirrors]", "### `[mirrors]`"),
    ("namespaces", "[namespaces.probe]", "### Namespaces"),
    ("tokens", "[[tokens]]", "### `[[tokens]]`"),
];

/// A key no table has, so the parser's refusal of it lists the keys the table does have.
const UNKNOWN_KEY: &str = "no_such_key_in_any_table";

fn document(path: &str) -> String {
    let path = crate::common::workspace_root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Fails naming every problem at once, so one run shows all the drift.
fn assert_none(problems: &[String], what: &str) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

// ---------------------------------------------------------------------------------------------------------
// Markdown: lines in or out of fences, sections by heading, code spans.

/// A line of a Markdown file and the info string of the fenced block it is inside (`None` in prose; the
/// fences' own lines are in neither and dropped).
#[derive(Clone, Copy)]
struct Line<'a> {
    text: &'a str,
    fence: Option<&'a str>,
}

/// The lines of `text` (the files use ``` fences only).
fn lines(text: &str) -> Vec<Line<'_>> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for text in text.lines() {
        if let Some(info) = text.trim_start().strip_prefix("```") {
            fence = match fence {
                None => Some(info.trim()),
                Some(_) => None,
            };
            continue;
        }
        out.push(Line { text, fence });
    }
    out
}

/// The level of a heading line (`## ...` is 2), if `line` is one.
fn heading_level(line: &Line) -> Option<usize> {
    if line.fence.is_some() {
        return None;
    }
    let level = line.text.chars().take_while(|&c| c == '#').count();
    (level > 0 && line.text[level..].starts_with(' ')).then_some(level)
}

/// The lines under `heading` (exactly that line), up to the next heading of its level or above.
fn section<'a>(text: &'a str, heading: &str) -> Option<Vec<Line<'a>>> {
    let all = lines(text);
    let start = all
        .iter()
        .position(|line| line.fence.is_none() && line.text.trim_end() == heading)?;
    let level = heading_level(&all[start]).expect("a heading");
    Some(
        all.into_iter()
            .skip(start + 1)
            .take_while(|line| heading_level(line).is_none_or(|l| l > level))
            .collect(),
    )
}

/// The lines before the first `##` heading (the title's `#` included).
fn preamble(text: &str) -> Vec<Line<'_>> {
    lines(text)
        .into_iter()
        .take_while(|line| heading_level(line) != Some(2))
        .collect()
}

/// The code spans of the prose lines, their contents (a backtick run closes only with a run of its length).
fn code_spans(lines: &[Line]) -> Vec<String> {
    let mut spans = Vec::new();
    for line in lines.iter().filter(|line| line.fence.is_none()) {
        let chars: Vec<char> = line.text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] != '`' {
                i += 1;
                continue;
            }
            let run = chars[i..].iter().take_while(|&&c| c == '`').count();
            let start = i + run;
            let mut j = start;
            let mut end = None;
            while j < chars.len() {
                let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                if other == run {
                    end = Some(j);
                    break;
                }
                j += other.max(1);
            }
            match end {
                Some(end) => {
                    spans.push(
                        chars[start..end]
                            .iter()
                            .collect::<String>()
                            .trim()
                            .to_string(),
                    );
                    i = end + run;
                }
                None => i = start,
            }
        }
    }
    spans
}

/// The long flags the code spans of `lines` name: each word of a span that begins with `--name`, alone, with
/// its value (`--batch N`, `--format lines\|raw\|hex`) or in a command (`existence-gate --version`).
fn documented_flags(lines: &[Line]) -> BTreeSet<String> {
    code_spans(lines)
        .iter()
        .flat_map(|span| span.split_whitespace())
        .filter_map(|word| {
            let name: String = word
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------
// The binary's commands and flags.

/// `existence-gate COMMAND... --help`, run without the `EXISTENCE_GATE_*` variables of this environment.
fn help(command: &[String]) -> String {
    let mut process = Command::new(env!("CARGO_BIN_EXE_existence-gate"));
    process.args(command).arg("--help");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EXISTENCE_GATE_") {
            process.env_remove(name);
        }
    }
    let output = process.output().expect("the binary runs");
    assert!(
        output.status.success(),
        "`existence-gate {} --help` failed: {output:?}",
        command.join(" ")
    );
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// The names under a help text's `Commands:` heading, but `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The long flags under a help text's `Options:` heading. An option's own line starts `  -x, --name` or
/// `      --name`; its description, when on lines of its own, is indented further.
fn flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|line| *line != "Options:")
        .filter_map(|line| {
            let rest = line.strip_prefix("      --").or_else(|| {
                let short = line.strip_prefix("  -")?;
                let mut chars = short.chars();
                chars.next()?;
                chars.as_str().strip_prefix(", --")
            })?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            Some(format!("--{name}"))
        })
        .collect()
}

/// Every command (`[]` the top level, `["replicas", "list"]`) with its long flags, from the help texts.
fn commands() -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut found = Vec::new();
    let mut pending = vec![Vec::new()];
    while let Some(command) = pending.pop() {
        let text = help(&command);
        for sub in subcommands(&text) {
            let mut path = command.clone();
            path.push(sub);
            pending.push(path);
        }
        found.push((command, flags(&text)));
    }
    found.sort();
    assert!(
        found.len() > 10,
        "only {} commands found in the help texts: has their layout changed?",
        found.len()
    );
    found
}

/// The part of the reference that must name `command`'s flags, and what to call it in a failure.
fn command_part<'a>(reference: &'a str, command: &str) -> (String, Option<Vec<Line<'a>>>) {
    let client = section(reference, "## Client commands");
    // The connection flags' table: the client commands' section up to the table of commands.
    let connection = || -> Vec<Line<'a>> {
        client
            .iter()
            .flatten()
            .take_while(|line| !line.text.starts_with("| Command |"))
            .copied()
            .collect()
    };
    match command {
        "" => (
            "the text above its first `##` heading".into(),
            Some(preamble(reference)),
        ),
        "serve" | "probe" | "hash-token" => {
            let heading = format!("## `{command}`");
            let part = section(reference, &heading);
            (format!("its section {heading}"), part)
        }
        "feed" => {
            let part = section(reference, "## `feed`").map(|mut part| {
                part.extend(connection());
                part
            });
            (
                "its section ## `feed` or the connection flags' table".into(),
                part,
            )
        }
        _ => {
            let row = format!("| `{command}` |");
            let part = client.as_ref().and_then(|client| {
                let row = client.iter().find(|line| line.text.starts_with(&row))?;
                let mut part = vec![*row];
                part.extend(connection());
                Some(part)
            });
            (
                format!("its row `{row}` of the table in ## Client commands, or the connection flags' table"),
                part,
            )
        }
    }
}

#[test]
fn every_flag_of_every_command_is_in_the_reference() {
    let reference = document(REFERENCE);
    let mut problems = Vec::new();
    for (command, flags) in commands() {
        let name = command.join(" ");
        let shown = if name.is_empty() {
            "existence-gate".to_string()
        } else {
            format!("existence-gate {name}")
        };
        let flags: Vec<&String> = flags.iter().filter(|flag| *flag != "--help").collect();
        if flags.is_empty() {
            // A group of commands (`replicas`): its subcommands have the flags.
            continue;
        }
        let (where_, part) = command_part(&reference, &name);
        let Some(part) = part else {
            problems.push(format!(
                "`{shown}` has no place in {REFERENCE}: expected {where_}"
            ));
            continue;
        };
        let documented = documented_flags(&part);
        for flag in flags {
            if !documented.contains(flag) {
                problems.push(format!(
                    "`{shown}` takes `{flag}`, which {REFERENCE} does not name in {where_}"
                ));
            }
        }
    }
    assert_none(&problems, "flags missing from the configuration reference");
}

#[test]
fn every_flag_the_docs_name_exists() {
    let existing: BTreeSet<String> = commands()
        .into_iter()
        .flat_map(|(_, flags)| flags)
        .collect();
    let mut problems = Vec::new();
    for path in [REFERENCE, CLI_PAGE] {
        for flag in documented_flags(&lines(&document(path))) {
            if !existing.contains(&flag) {
                problems.push(format!(
                    "{path} names `{flag}`, which no command's --help lists"
                ));
            }
        }
    }
    assert_none(&problems, "flags documented that do not exist");
}

// ---------------------------------------------------------------------------------------------------------
// The configuration file's keys.

/// The keys the parser accepts in the table `header` opens (`""`: the top level), as it lists them when it
/// refuses [`UNKNOWN_KEY`] there.
fn accepted_keys(header: &str) -> BTreeSet<String> {
    let text = format!("{header}\n{UNKNOWN_KEY} = 0\n");
    let where_ = if header.is_empty() {
        "at the top level".to_string()
    } else {
        format!("in {header}")
    };
    let error = match GateConfig::from_toml(&text) {
        Ok(_) => panic!(
            "the configuration parser accepts an unknown key {where_}: the table lost \
             #[serde(deny_unknown_fields)], so a misspelt key would be ignored"
        ),
        Err(error) => error.to_string(),
    };
    let marker = format!("unknown field `{UNKNOWN_KEY}`");
    let listed = error
        .find(&marker)
        .and_then(|at| error[at + marker.len()..].lines().next())
        .and_then(|rest| {
            rest.strip_prefix(", expected one of ")
                .or_else(|| rest.strip_prefix(", expected "))
        })
        .unwrap_or_else(|| {
            panic!("cannot read the keys accepted {where_} from the parser's refusal: {error}")
        });
    let keys: BTreeSet<String> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(!keys.is_empty(), "no keys read {where_} from: {error}");
    keys
}

/// The keys of a section's table: the rows whose first cell is a code span.
fn key_rows(section: &[Line]) -> BTreeSet<String> {
    section
        .iter()
        .filter(|line| line.fence.is_none())
        .filter_map(|line| line.text.strip_prefix("| `")?.split('`').next())
        .map(str::to_string)
        .collect()
}

/// The reference's example configuration file: the first TOML block of its section.
fn example(reference: &str) -> String {
    let section = section(reference, "## The configuration file")
        .expect("the reference has a section ## The configuration file");
    let block: Vec<&str> = section
        .iter()
        .skip_while(|line| line.fence != Some("toml"))
        .take_while(|line| line.fence == Some("toml"))
        .map(|line| line.text)
        .collect();
    assert!(
        !block.is_empty(),
        "no ```toml block under ## The configuration file"
    );
    block.join("\n") + "\n"
}

/// The keys the example shows, set or commented out (`# max_filter_bytes = ...`), by top-level table.
fn example_keys(example: &str) -> Vec<(String, String)> {
    let is_key = |text: &str| {
        text.starts_with(|c: char| c.is_ascii_lowercase())
            && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut table = String::new();
    let mut keys = Vec::new();
    for line in example.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            let header = line.split('#').next().unwrap_or_default().trim();
            table = header
                .trim_matches(|c| c == '[' || c == ']')
                .split('.')
                .next()
                .unwrap_or_default()
                .to_string();
            continue;
        }
        let line = line.trim_start_matches('#').trim_start();
        if let Some((key, _)) = line.split_once(" = ") {
            if is_key(key.trim()) {
                keys.push((table.clone(), key.trim().to_string()));
            }
        }
    }
    keys
}

#[test]
fn every_key_of_the_configuration_file_is_in_the_reference() {
    let reference = document(REFERENCE);
    let known: BTreeSet<String> = TABLES.iter().map(|(name, ..)| name.to_string()).collect();
    let top = accepted_keys("");
    assert_eq!(
        top, known,
        "the configuration file's tables are not the ones this test knows: give each new one a section in \
         {REFERENCE} listing its keys, and a line in TABLES"
    );
    let shown = example_keys(&example(&reference));
    let mut problems = Vec::new();
    for (table, header, heading) in TABLES {
        let accepted = accepted_keys(header);
        let Some(section) = section(&reference, heading) else {
            problems.push(format!("{REFERENCE} has no section {heading} for {header}"));
            continue;
        };
        let rows = key_rows(&section);
        for key in &accepted {
            if !rows.contains(key) {
                problems.push(format!(
                    "{header} accepts `{key}`, which is not a row of {heading}'s table"
                ));
            }
            if !shown.contains(&(table.to_string(), key.clone())) {
                problems.push(format!(
                    "{header} accepts `{key}`, which the example file under ## The configuration file \
                     does not show (set, or commented out)"
                ));
            }
        }
    }
    assert_none(&problems, "keys missing from the configuration reference");
}

#[test]
fn every_key_the_reference_names_is_accepted() {
    let reference = document(REFERENCE);
    let mut problems = Vec::new();
    let mut accepted_by_table = Vec::new();
    for (table, header, heading) in TABLES {
        let accepted = accepted_keys(header);
        let rows = section(&reference, heading)
            .map(|s| key_rows(&s))
            .unwrap_or_default();
        for key in rows.difference(&accepted) {
            problems.push(format!(
                "{heading} documents `{key}`, which {header} does not accept"
            ));
        }
        accepted_by_table.push((table, accepted));
    }
    for (table, key) in example_keys(&example(&reference)) {
        let accepted = accepted_by_table
            .iter()
            .find(|(name, _)| *name == table)
            .map(|(_, keys)| keys);
        if !accepted.is_some_and(|keys| keys.contains(&key)) {
            problems.push(format!(
                "the example file shows `{key}` in `[{table}...]`, which the parser does not accept there"
            ));
        }
    }
    assert_none(&problems, "keys documented that the parser refuses");
}

/// The reference says every field has a default, "the values above": the example's `[limits]`,
/// `[mirrors]` and namespaces, read by the parser, are exactly the defaults. (Its `[[tokens]]` entry has no defaults and a
/// placeholder hash; its keys are checked above.)
#[test]
fn the_example_configuration_shows_the_defaults() {
    let mut example: toml::Table = toml::from_str(&example(&document(REFERENCE)))
        .expect("the example configuration file is TOML");
    example.remove("tokens");
    let text = toml::to_string(&example).expect("a table serialises");
    let config = GateConfig::from_toml(&text)
        .unwrap_or_else(|e| panic!("the example configuration file is refused: {e}\n{text}"));
    assert_eq!(
        config.limits,
        Limits::default(),
        "the example's [limits] are not the defaults"
    );
    assert_eq!(
        config.mirrors,
        Mirrors::default(),
        "the example's [mirrors] are not the defaults"
    );
    let namespaces: Vec<&String> = example
        .get("namespaces")
        .and_then(|n| n.as_table())
        .map(|n| n.keys().collect())
        .unwrap_or_default();
    assert!(
        !namespaces.is_empty(),
        "the example configures no namespace"
    );
    for name in namespaces {
        assert_eq!(
            config.namespaces[name],
            NamespaceSettings::default(),
            "the example's [namespaces.{name}] is not the defaults"
        );
    }
}
