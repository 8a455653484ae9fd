-- How many tool calls one model turn may propose: a turn with more is refused whole and the
-- model told so, which bounds the pending calls, their previews and the sealed state.
ALTER TABLE agents
    ADD COLUMN max_tool_calls_per_turn integer NOT NULL DEFAULT 16
        CHECK (max_tool_calls_per_turn BETWEEN 1 AND 256);
