-- The last audit sequence number of each run, in a row of its own. An appender takes the next
-- number with an upsert that increments it, which always acts on the row's latest version and
-- locks it until commit, so a transition and its audit rows can be one statement (a
-- `max(sequence)` read in that statement could see an older snapshot of the trail), and an
-- audited refusal still leaves the run's row untouched.
create table run_trails (
    run_id        uuid primary key references runs (id) on delete cascade,
    last_sequence bigint not null check (last_sequence >= 1)
);
insert into run_trails (run_id, last_sequence)
select run_id, max(sequence) from run_events group by run_id;
