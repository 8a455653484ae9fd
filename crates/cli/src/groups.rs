//! `countersign groups …` and `countersign delegations …`: approver groups and delegations in
//! the directory. Managed like grants; every change is audited with who made it (`--by`).

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use countersign_store::Store;
use uuid::Uuid;

#[derive(Debug, Subcommand)]
pub enum GroupsCommand {
    /// Creates group NAME (a name of letters, digits, `_`, `.` and `-`).
    Create {
        name: String,
        /// Who makes the change, for the audit.
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Adds USER to GROUP.
    Add {
        group: String,
        user: String,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Removes USER from GROUP.
    Remove {
        group: String,
        user: String,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Lists the groups with their members.
    List,
}

#[derive(Debug, Subcommand)]
pub enum DelegationsCommand {
    /// "DELEGATOR's cards go to DELEGATE from … until …": DELEGATE may vote for the groups of
    /// DELEGATOR (and decide what DELEGATOR may) within the window.
    Add {
        delegator: String,
        delegate: String,
        /// RFC 3339; the database's now when left out.
        #[arg(long)]
        from: Option<DateTime<Utc>>,
        /// RFC 3339.
        #[arg(long)]
        until: DateTime<Utc>,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Takes delegation ID back.
    Remove {
        id: Uuid,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Lists the delegations.
    List,
}

pub async fn groups(store: &Store, command: GroupsCommand) -> anyhow::Result<()> {
    match command {
        GroupsCommand::Create { name, by } => {
            if !countersign_store::is_group_name(&name) {
                bail!(
                    "{name:?} cannot name a group: a letter or digit, then up to 127 letters, \
                     digits, `_`, `.` and `-`"
                );
            }
            let created = store.create_group(&by, &name).await?;
            say!(
                "{}",
                if created {
                    format!("group {name} created")
                } else {
                    format!("group {name} exists")
                }
            );
        }
        GroupsCommand::Add { group, user, by } => {
            if !store.add_member(&by, &group, &user).await? {
                bail!("no group {group:?}");
            }
            say!("{user} is in {group}");
        }
        GroupsCommand::Remove { group, user, by } => {
            let removed = store.remove_member(&by, &group, &user).await?;
            say!(
                "{}",
                if removed {
                    format!("{user} removed from {group}")
                } else {
                    format!("{user} was not in {group}")
                }
            );
        }
        GroupsCommand::List => {
            for g in store.groups().await? {
                say!("{}\t{}", g.name, g.members.join(","));
            }
        }
    }
    Ok(())
}

pub async fn delegations(store: &Store, command: DelegationsCommand) -> anyhow::Result<()> {
    match command {
        DelegationsCommand::Add {
            delegator,
            delegate,
            from,
            until,
            by,
        } => {
            if from.is_some_and(|from| from >= until) {
                bail!("a delegation ends after it starts");
            }
            let id = store
                .delegate(&by, &delegator, &delegate, from, until)
                .await?;
            say!("delegation {id}: {delegator}'s cards go to {delegate} until {until}");
        }
        DelegationsCommand::Remove { id, by } => {
            let removed = store.remove_delegation(&by, id).await?;
            say!(
                "{}",
                if removed {
                    "removed"
                } else {
                    "no such delegation"
                }
            );
        }
        DelegationsCommand::List => {
            for d in store.delegations().await? {
                say!(
                    "{}\t{} -> {}\t{} .. {}",
                    d.id,
                    d.delegator,
                    d.delegate,
                    d.starts_at.to_rfc3339(),
                    d.ends_at.to_rfc3339()
                );
            }
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum SlackCommand {
    /// Maps Slack user SLACK_USER of workspace TEAM (their ids, e.g. T0123 and U0456) to
    /// directory user USER: their button presses decide as USER. Nothing else maps a Slack user.
    Map {
        team: String,
        slack_user: String,
        user: String,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Takes a mapping back: the Slack user decides nothing any more.
    Unmap {
        team: String,
        slack_user: String,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Clears channel CHANNEL of workspace TEAM for previews of calls of data class CLASS and
    /// below (public, editor_content, personal_data, secret_adjacent): the card's message for
    /// that channel shows them, as far as its viewer may see them. Other channels see none.
    Clear {
        team: String,
        channel: String,
        #[arg(long)]
        class: countersign_core::DataClass,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Takes a channel's clearance back: its messages show no content any more.
    Unclear {
        team: String,
        channel: String,
        #[arg(long, default_value = "operator")]
        by: String,
    },
}

pub async fn slack(store: &Store, command: SlackCommand) -> anyhow::Result<()> {
    match command {
        SlackCommand::Map {
            team,
            slack_user,
            user,
            by,
        } => {
            store.map_slack_user(&by, &team, &slack_user, &user).await?;
            say!("Slack user {slack_user} of {team} decides as {user}");
        }
        SlackCommand::Unmap {
            team,
            slack_user,
            by,
        } => {
            let removed = store.unmap_slack_user(&by, &team, &slack_user).await?;
            say!(
                "{}",
                if removed {
                    "unmapped"
                } else {
                    "no such mapping"
                }
            );
        }
        SlackCommand::Clear {
            team,
            channel,
            class,
            by,
        } => {
            store
                .clear_slack_channel(&by, &team, &channel, class)
                .await?;
            say!("channel {channel} of {team} shows previews of {class} and below");
        }
        SlackCommand::Unclear { team, channel, by } => {
            let removed = store.unclear_slack_channel(&by, &team, &channel).await?;
            say!(
                "{}",
                if removed {
                    "cleared no more"
                } else {
                    "the channel was not cleared"
                }
            );
        }
    }
    Ok(())
}
