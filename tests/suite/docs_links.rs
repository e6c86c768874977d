//! The documentation's links: every relative link in README.md, ARCHITECTURE.md and docs/**/*.md must lead to
//! a file or directory that exists, and every `#anchor` into a Markdown file to one of its headings, as GitHub
//! names them. And README.md stays short: what does not fit belongs in docs/.
//!
//! Links inside fenced code blocks and code spans are not links; absolute URLs (`https://...`, `mailto:`) are
//! not checked. Plain std: a small Markdown reader that knows headings, fences, code spans, inline links,
//! images and reference definitions, which is all these files use.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

/// README.md's budget: the pitch, the commands, the tour, the contract in brief, and links.
const README_MAX_LINES: usize = 300;

fn root() -> PathBuf {
    crate::common::workspace_root()
}

/// README.md, ARCHITECTURE.md and every Markdown file under docs/, sorted.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut pending = vec![root.join("docs")];
    let mut found = Vec::new();
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    files.extend(found);
    files
}

/// The lines of `text` outside fenced code blocks (``` or ~~~), with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<(char, usize)> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |c| trimmed.chars().take_while(|&x| x == c).count());
        match (fence, marker) {
            (None, Some(c)) if run >= 3 => fence = Some((c, run)),
            (Some((c, open)), Some(m))
                if m == c && run >= open && trimmed.trim_end().len() == run =>
            {
                fence = None
            }
            (None, _) => lines.push((index + 1, line)),
            (Some(_), _) => {}
        }
    }
    lines
}

/// `line` with its code spans blanked out (a backtick run closes only with a run of the same length).
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + run;
        let mut closed = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                if other == run {
                    closed = Some(j + other);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                out.extend(std::iter::repeat_n(' ', end - i));
                i = end;
            }
            None => {
                // An unmatched run is literal text.
                out.extend(std::iter::repeat_n('`', run));
                i += run;
            }
        }
    }
    out
}

/// The destinations of the inline links and images in `line` (code spans already removed): what follows
/// `](` up to its balanced `)`, without a title.
fn inline_destinations(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let inside = after[..end].trim();
        let destination = if let Some(angled) = inside.strip_prefix('<') {
            angled.split('>').next().unwrap_or("")
        } else {
            inside.split_whitespace().next().unwrap_or("")
        };
        found.push(destination.to_string());
        rest = &after[end..];
    }
    found
}

/// The destination of a reference definition (`[label]: destination`), if `line` is one.
fn reference_destination(line: &str) -> Option<String> {
    let trimmed = line.trim_start();
    let label_end = trimmed.strip_prefix('[')?.find("]:")?;
    let destination = trimmed[label_end + 3..].split_whitespace().next()?;
    Some(destination.trim_matches(['<', '>']).to_string())
}

/// The text of a heading as GitHub renders it: code spans keep their content, links and images their text,
/// and emphasis markers go (`*`; `_` is kept, so a heading should not use `_emphasis_`).
fn heading_text(raw: &str) -> String {
    let mut text = String::new();
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '`' => i += 1,
            '!' if chars.get(i + 1) == Some(&'[') => i += 1,
            '[' => i += 1,
            ']' if chars.get(i + 1) == Some(&'(') => {
                // Skip the destination.
                let mut depth = 0usize;
                i += 2;
                while i < chars.len() {
                    match chars[i] {
                        '(' => depth += 1,
                        ')' if depth == 0 => break,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    i += 1;
                }
                i += 1;
            }
            c => {
                text.push(c);
                i += 1;
            }
        }
    }
    text
}

/// GitHub's anchor for a heading's text: lowercased, punctuation dropped but for `-` and `_`, spaces turned
/// into `-`.
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's ATX headings, a repeated one numbered `-1`, `-2`, ... as GitHub does.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || line.len() - trimmed.len() > 3 {
            continue;
        }
        let Some(title) = trimmed[hashes..].strip_prefix(' ') else {
            continue;
        };
        let title = title.trim().trim_end_matches('#').trim_end();
        let base = slug(&heading_text(title));
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// `%20` and the like in a link's path.
fn percent_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        if let (b'%', Some(Ok(byte))) = (bytes[i], hex.map(|h| u8::from_str_radix(h, 16))) {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path`, made of `..` and names, stays inside the repository.
fn inside_repository(path: &Path) -> bool {
    let mut depth: i32 = 0;
    for component in path.components() {
        match component {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// Why `destination`, a link in `document`, does not resolve, if it does not.
fn broken(document: &Path, destination: &str) -> Option<String> {
    if destination.is_empty() {
        return Some("the link has no destination".to_string());
    }
    if destination.contains("://") || destination.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match destination.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (destination, None),
    };
    let path = path.split('?').next().unwrap_or("");
    let target = if path.is_empty() {
        document.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        root().join(percent_decoded(from_root))
    } else {
        let base = document.parent().expect("a document has a directory");
        base.join(percent_decoded(path))
    };
    let relative = target.strip_prefix(root()).unwrap_or(&target);
    if !inside_repository(relative) {
        return Some(format!("{} is outside the repository", relative.display()));
    }
    if !target.exists() {
        return Some(format!("{} does not exist", relative.display()));
    }
    let anchor = anchor?;
    let markdown = if target.is_dir() {
        target.join("README.md")
    } else {
        target.clone()
    };
    if markdown.extension().is_none_or(|ext| ext != "md") {
        // Anchors into source files are line numbers (#L10), which GitHub resolves by itself.
        let line_anchor = anchor.strip_prefix('L').is_some_and(|rest| {
            rest.split("-L")
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        return (!line_anchor).then(|| {
            format!(
                "#{anchor} points into {}, which is not Markdown and has no such anchor",
                relative.display()
            )
        });
    }
    let text = std::fs::read_to_string(&markdown)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", markdown.display()));
    if anchors(&text).contains(&percent_decoded(anchor).to_lowercase()) {
        None
    } else {
        Some(format!(
            "no heading of {} has the anchor #{anchor}",
            markdown.strip_prefix(root()).unwrap_or(&markdown).display()
        ))
    }
}

#[test]
fn every_relative_link_and_anchor_in_the_documentation_resolves() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(&document)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", document.display()));
        let name = document
            .strip_prefix(root())
            .unwrap_or(&document)
            .display()
            .to_string();
        for (number, line) in prose_lines(&text) {
            let prose = without_code_spans(line);
            let mut destinations = inline_destinations(&prose);
            destinations.extend(reference_destination(&prose));
            for destination in destinations {
                checked += 1;
                if let Some(reason) = broken(&document, &destination) {
                    failures.push(format!("{name}:{number}: ({destination}): {reason}"));
                }
            }
        }
    }
    assert!(
        checked > 0,
        "no links found: is the documentation where this test looks?"
    );
    assert!(
        failures.is_empty(),
        "{} broken link(s) in the documentation:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn readme_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into docs/ and link to it"
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(slug("Try it in one minute"), "try-it-in-one-minute");
    assert_eq!(
        slug(&heading_text("`GateClient`: the gate's calls, coalesced")),
        "gateclient-the-gates-calls-coalesced"
    );
    assert_eq!(
        slug(&heading_text("Several replicas sharing a host's cores")),
        "several-replicas-sharing-a-hosts-cores"
    );
    assert_eq!(slug(&heading_text("`[[tokens]]`")), "tokens");
    assert_eq!(
        slug("Single-key callers, 2026-12-04"),
        "single-key-callers-2026-12-04"
    );
    assert_eq!(
        slug(&heading_text("See [the docs](docs/README.md) now")),
        "see-the-docs-now"
    );
    let repeated = anchors("# A\n\n## Notes\n\n```sh\n# not a heading\n```\n\n## Notes\n");
    let expected: HashSet<String> = ["a", "notes", "notes-1"].map(String::from).into();
    assert_eq!(repeated, expected);
}

#[test]
fn links_in_code_are_not_links() {
    let line = without_code_spans("see `[x](nowhere.md)` and [y](docs/README.md)");
    assert_eq!(
        inline_destinations(&line),
        vec!["docs/README.md".to_string()]
    );
    assert_eq!(
        inline_destinations("[a](b.md \"title\") ![c](<d e.svg>) [f](g(h).md)"),
        vec!["b.md", "d e.svg", "g(h).md"]
    );
    assert_eq!(
        reference_destination("[label]: ../x.md#y"),
        Some("../x.md#y".to_string())
    );
    assert_eq!(prose_lines("a\n```\n[x](y)\n```\nb").len(), 2);
}
