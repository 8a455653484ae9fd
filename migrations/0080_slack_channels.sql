-- Slack channels an operator cleared for a data class: the card's message for such a channel
-- may show the previews of calls of that class or a lower one (public < editor_content <
-- personal_data < secret_adjacent), as far as the viewer may see them. No row: the message
-- shows no content, only how many writes on which pages.
create table slack_channels (
    team_id     text not null check (team_id <> '' and length(team_id) <= 64),
    channel_id  text not null check (channel_id <> '' and length(channel_id) <= 64),
    data_class  text not null check (data_class in
        ('public', 'editor_content', 'personal_data', 'secret_adjacent')),
    cleared_by  text not null,
    cleared_at  timestamptz not null default now(),
    primary key (team_id, channel_id)
);

alter table directory_audit drop constraint directory_audit_action_check;
alter table directory_audit add constraint directory_audit_action_check check (action in
    ('group_created', 'group_deleted', 'member_added', 'member_removed',
     'delegation_created', 'delegation_removed', 'slack_user_mapped',
     'slack_user_unmapped', 'slack_channel_cleared', 'slack_channel_uncleared'));
