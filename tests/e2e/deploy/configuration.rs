//! `docs/configuration.md`'s table is the configuration: each row's variables and flags are
//! what the `--help` of each binary it names lists, and each binary's `--help` lists nothing
//! the table does not give it.

use std::collections::{BTreeMap, BTreeSet};

use countersign_e2e::workspace_file;

/// The names the table's "read by" column uses, and the binaries they stand for.
const BINARIES: [(&str, &str); 5] = [
    ("worker", "countersign-worker"),
    ("coordinator", "countersign-coordinator"),
    ("api", "countersign-api"),
    ("reaper", "countersign-reaper"),
    ("countersign", "countersign"),
];

/// One row of the table: its variables, its flags and the binaries that read them.
#[derive(Debug)]
struct Row {
    line: usize,
    variables: Vec<String>,
    flags: Vec<String>,
    read_by: BTreeSet<String>,
}

/// The words between backticks in `cell`.
fn quoted(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The table's rows; a row whose variable name is data (`…<NAME>`, or named by a setting) has
/// no variable of its own and is left out.
fn table() -> Vec<Row> {
    let text = std::fs::read_to_string(workspace_file("docs/configuration.md")).unwrap();
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| variable (flag) | read by | meaning | default |`: six pieces around the bars.
        if cells.len() != 6 || !cells[1].starts_with('`') {
            continue;
        }
        let names = quoted(cells[1]);
        let variables: Vec<String> = names
            .iter()
            .filter(|w| {
                w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
            .map(|w| (*w).to_owned())
            .collect();
        if variables.is_empty() {
            continue;
        }
        let flags = names
            .iter()
            .filter(|w| w.starts_with("--"))
            .map(|w| (*w).to_owned())
            .collect();
        let read_by = cells[2]
            .split(',')
            .map(|w| w.trim().to_owned())
            .filter(|w| !w.is_empty())
            .collect();
        rows.push(Row {
            line: n + 1,
            variables,
            flags,
            read_by,
        });
    }
    assert!(rows.len() > 20, "the table was not found: {rows:?}");
    rows
}

#[test]
fn the_configuration_table_lists_exactly_what_each_binary_reads() {
    let rows = table();
    let known: BTreeSet<&str> = BINARIES.iter().map(|(short, _)| *short).collect();
    for row in &rows {
        for name in &row.read_by {
            assert!(
                known.contains(name.as_str()),
                "docs/configuration.md:{}: no binary {name:?}",
                row.line
            );
        }
    }
    let mut mismatches = BTreeMap::new();
    for (short, binary) in BINARIES {
        let help = super::help(&[binary]);
        let given: Vec<&Row> = rows.iter().filter(|r| r.read_by.contains(short)).collect();
        let documented: BTreeSet<String> = given.iter().flat_map(|r| r.variables.clone()).collect();
        if documented != help.env {
            mismatches.insert(
                binary,
                format!(
                    "only in --help: {:?}; only in the table: {:?}",
                    help.env.difference(&documented).collect::<Vec<_>>(),
                    documented.difference(&help.env).collect::<Vec<_>>()
                ),
            );
        }
        for row in given {
            for flag in &row.flags {
                assert!(
                    help.flags.contains(flag),
                    "docs/configuration.md:{}: {binary} has no {flag}",
                    row.line
                );
            }
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}
