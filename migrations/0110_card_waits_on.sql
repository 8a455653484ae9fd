-- Whom a waiting card waits on, as the inbox asks it for one viewer, named once:
--
-- `ours`: one of the viewer's groups (its own, a delegator's while the delegation runs, or the
-- backup group the card was escalated to) is among the groups the agent's quorum, or the
-- card's route, requires — or the backup group;
-- `voted`: the viewer has voted on the card;
-- `single`: neither the agent nor the card's route asks for groups: one approver decides.
create function card_waits_on(card_run uuid, card_seq integer, card_agent text, viewer text,
                              out ours boolean, out voted boolean, out single boolean)
language sql stable
as $$
    with mine as (
        select array(
            select group_name from approver_group_members where member = viewer
            union
            select m.group_name from approver_delegations d
            join approver_group_members m on m.member = d.delegator
            where d.delegate = viewer and d.starts_at <= now() and now() < d.ends_at) as groups)
    select
        exists (select 1 from agent_approvers a, jsonb_array_elements(a.requirements) q
                where a.agent = card_agent and q->>'group' = any (mine.groups))
        or exists (select 1 from card_routes r, jsonb_array_elements(r.requirements) q
                   where (r.run_id, r.suspension_seq) = (card_run, card_seq)
                     and q->>'group' = any (mine.groups))
        or exists (select 1 from card_alerts c
                   where c.run_id = card_run and c.suspension_seq = card_seq
                     and c.kind = 'escalated' and c.backup_group = any (mine.groups)),
        exists (select 1 from card_votes v
                where v.run_id = card_run and v.suspension_seq = card_seq and v.voter = viewer),
        not exists (select 1 from agent_approvers a
                    where a.agent = card_agent and jsonb_array_length(a.requirements) > 0)
        and not exists (select 1 from card_routes r
                        where (r.run_id, r.suspension_seq) = (card_run, card_seq))
    from mine
$$;
