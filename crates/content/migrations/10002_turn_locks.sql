-- What an approved turn locks so that nothing a writer's preview reads can change before the
-- turn commits, whoever the other writer is: a colleague editing the store in plain SQL at READ
-- COMMITTED takes none of countersign's locks, so the locks must be ones PostgreSQL makes every
-- writer wait for.
--
-- A turn first locks each call's subjects FOR UPDATE (crates/content/src/writer.rs). Then, for
-- each call, the function `content.lock_reads_<tool>` of its writer locks FOR SHARE every other
-- row the writer's plan reads — soft-deleted rows of a set included, since restoring one changes
-- the set. FOR SHARE makes an UPDATE or DELETE of the row wait for the turn's commit, and a
-- SELECT … FOR UPDATE too. Rows that could JOIN a set the plan reads (a new reference of an
-- element, a new element on a page, a new translation) are kept out by the subject lock on the
-- set's parent: inserting a row, or moving one into the set, checks the row's foreign key to the
-- parent with a FOR KEY SHARE lock, which waits for a FOR UPDATE. `pages.pid` has no foreign key
-- (0 is the root of the tree, not a page), so the trigger below takes that same lock for it.
--
-- Each function returns how many rows it locked, which says nothing to the caller but is there
-- to read when a lock set is in question. crates/content/README.md lists each writer's read set
-- and how it is covered; the lock-coverage harness (crates/worker/tests/it/lock_coverage.rs)
-- mutates every kind of row of it from another session between re-plan and write.

-- A page's parent, as the foreign key `pages.pid` would lock it if 0 were a page: a new page
-- below a parent, or a page moved below it, waits for a turn that locked the parent FOR UPDATE
-- to plan against its subpages.
CREATE FUNCTION content.lock_parent_page() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.pid <> 0 THEN
        PERFORM 1 FROM content.pages WHERE uid = NEW.pid FOR KEY SHARE;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER pages_parent_lock
    BEFORE INSERT OR UPDATE OF pid ON content.pages
    FOR EACH ROW EXECUTE FUNCTION content.lock_parent_page();

-- The acting user as every permission check reads it: the user row (admin flag, disabled,
-- languages, page mounts, field grants), the user's file mounts, and the whole table of exclude
-- fields — a new exclude field takes a right away, so the table is locked against every change
-- (SHARE mode: other turns read it at once; a colleague's INSERT, UPDATE or DELETE waits).
CREATE FUNCTION content.lock_user(p_name text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_uid bigint;
    v_rows integer;
BEGIN
    LOCK TABLE content.exclude_fields IN SHARE MODE;
    SELECT uid INTO v_uid FROM content.users WHERE name = p_name FOR SHARE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM content.file_mounts WHERE user_uid = v_uid ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN 1 + v_rows;
END
$$;

-- The rootline of a page as `content.rootline` reads it: the page, for a translation its
-- default-language page, and every page above, up to the root — deleted ones included, since
-- deleting or restoring any of them changes whether the page exists.
CREATE FUNCTION content.lock_rootline(p_page bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_parent bigint;
    v_current bigint;
    v_next bigint;
    v_rows integer := 0;
BEGIN
    SELECT l10n_parent INTO v_parent FROM content.pages WHERE uid = p_page FOR SHARE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_rows := 1;
    v_current := coalesce(v_parent, p_page);
    WHILE v_current IS NOT NULL AND v_current <> 0 AND v_rows < 66 LOOP
        SELECT pid INTO v_next FROM content.pages WHERE uid = v_current FOR SHARE;
        EXIT WHEN NOT FOUND;
        v_rows := v_rows + 1;
        v_current := v_next;
    END LOOP;
    RETURN v_rows;
END
$$;

-- An element as `Element::load` reads it: its row and the rootline of its page.
CREATE FUNCTION content.lock_element(p_element bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_pid bigint;
BEGIN
    SELECT pid INTO v_pid FROM content.elements WHERE uid = p_element FOR SHARE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    RETURN 1 + content.lock_rootline(v_pid);
END
$$;

-- A file as `File::load` reads it: its row and its storage's.
CREATE FUNCTION content.lock_file(p_file bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM 1 FROM content.files f JOIN content.storages s ON s.uid = f.storage
    WHERE f.uid = p_file FOR SHARE;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows * 2;
END
$$;

-- Every element on the given pages, in every column, language, workspace and state: a column
-- is read from these rows, and any of them can be moved, re-sorted, hidden, deleted or
-- restored into one. New elements wait for the pages' subject locks.
CREATE FUNCTION content.lock_elements_on(p_pages bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM 1 FROM content.elements WHERE pid = ANY (p_pages) ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END
$$;

-- update_page_metadata: the page (its subject, locked FOR UPDATE already), its rootline, the
-- acting user.
CREATE FUNCTION content.lock_reads_update_page_metadata(p_user text, p_page bigint)
RETURNS integer LANGUAGE sql AS $$
    SELECT content.lock_user(p_user) + content.lock_rootline(p_page)
$$;

-- set_file_alternative_text: the file (its subject) and its storage; every metadata row of the
-- file, of every language and workspace (an UPDATE could move one into the default language of
-- the live workspace; a new row waits for the file's subject lock); the acting user.
CREATE FUNCTION content.lock_reads_set_file_alternative_text(p_user text, p_file bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM 1 FROM content.file_metadata WHERE file = p_file ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN content.lock_user(p_user) + content.lock_file(p_file) + v_rows;
END
$$;

-- attach_file_to_content_element: the element (its subject) and its page's rootline; the file
-- and its storage; the extensions the field accepts; every reference of the element, of every
-- field and state (the count, where the new one lands; new references wait for the element's
-- subject lock); the acting user.
CREATE FUNCTION content.lock_reads_attach_file_to_content_element(
    p_user text, p_element bigint, p_file bigint, p_field text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_extensions integer;
    v_references integer;
BEGIN
    PERFORM 1 FROM content.reference_field_extensions WHERE field = p_field
    ORDER BY extension FOR SHARE;
    GET DIAGNOSTICS v_extensions = ROW_COUNT;
    PERFORM 1 FROM content.file_references WHERE element = p_element ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_references = ROW_COUNT;
    RETURN content.lock_user(p_user) + content.lock_element(p_element)
        + content.lock_file(p_file) + v_extensions + v_references;
END
$$;

-- move_content_element: the element (a subject); the page it is on now, FOR UPDATE as a
-- subject — locked here again in case the element moved between naming its subjects and
-- locking them, so that no element can join its old column unseen; the target page (a
-- subject); both pages' rootlines; every element on both pages (the columns, both
-- positions); the neighbour named and its page's rootline; the element's translations (the
-- count that moves with it; a new one waits for the element's subject lock); the acting user.
CREATE FUNCTION content.lock_reads_move_content_element(
    p_user text, p_element bigint, p_target bigint, p_after bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_source bigint;
    v_translations integer;
BEGIN
    SELECT pid INTO v_source FROM content.elements WHERE uid = p_element;
    PERFORM 1 FROM content.pages WHERE uid = v_source FOR UPDATE;
    PERFORM 1 FROM content.elements WHERE l10n_parent = p_element ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_translations = ROW_COUNT;
    RETURN content.lock_user(p_user)
        + content.lock_rootline(p_target)
        + coalesce(content.lock_rootline(v_source), 0)
        + content.lock_elements_on(ARRAY[p_target, v_source])
        + coalesce(content.lock_element(p_after), 0)
        + v_translations;
END
$$;

-- create_page_draft: the parent (its subject) and its rootline; every page below the parent,
-- of every language, workspace and state (the subpages and the new page's position; a new page
-- below it waits for the subject lock through pages_parent_lock); the neighbour named and its
-- rootline; the acting user.
CREATE FUNCTION content.lock_reads_create_page_draft(p_user text, p_parent bigint, p_after bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM 1 FROM content.pages WHERE pid = p_parent ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN content.lock_user(p_user) + content.lock_rootline(p_parent) + v_rows
        + coalesce(content.lock_rootline(p_after), 0);
END
$$;

-- create_content_element_draft: the page (its subject) and its rootline; every element on it
-- (the column and the new element's position; a new one waits for the subject lock); the
-- neighbour named and its page's rootline; the acting user.
CREATE FUNCTION content.lock_reads_create_content_element_draft(
    p_user text, p_page bigint, p_after bigint)
RETURNS integer LANGUAGE sql AS $$
    SELECT content.lock_user(p_user) + content.lock_rootline(p_page)
        + content.lock_elements_on(ARRAY[p_page]) + coalesce(content.lock_element(p_after), 0)
$$;

-- create_translation_draft of a page: the page (its subject) and its rootline; the language;
-- every translation of the page, of every language, workspace and state (the existing one the
-- call would discard; a new one waits for the subject lock through the foreign key
-- `l10n_parent`); the acting user.
CREATE FUNCTION content.lock_reads_translate_page(p_user text, p_page bigint, p_language integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM 1 FROM content.languages WHERE uid = p_language FOR SHARE;
    PERFORM 1 FROM content.pages WHERE l10n_parent = p_page ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN content.lock_user(p_user) + content.lock_rootline(p_page) + 1 + v_rows;
END
$$;

-- create_translation_draft of a content element: the element (its subject) and its page's
-- rootline; the element's page FOR UPDATE, so that a translation of the page cannot appear or
-- vanish unseen (the element's translation needs one) — its translations FOR SHARE; the
-- language; the element's references (copied with it; a new one waits for the subject lock);
-- every translation of the element; the acting user.
CREATE FUNCTION content.lock_reads_translate_element(
    p_user text, p_element bigint, p_language integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_pid bigint;
    v_page_translations integer;
    v_references integer;
    v_translations integer;
BEGIN
    SELECT pid INTO v_pid FROM content.elements WHERE uid = p_element;
    PERFORM 1 FROM content.pages WHERE uid = v_pid FOR UPDATE;
    PERFORM 1 FROM content.pages WHERE l10n_parent = v_pid ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_page_translations = ROW_COUNT;
    PERFORM 1 FROM content.languages WHERE uid = p_language FOR SHARE;
    PERFORM 1 FROM content.file_references WHERE element = p_element ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_references = ROW_COUNT;
    PERFORM 1 FROM content.elements WHERE l10n_parent = p_element ORDER BY uid FOR SHARE;
    GET DIAGNOSTICS v_translations = ROW_COUNT;
    RETURN content.lock_user(p_user) + content.lock_element(p_element) + v_page_translations
        + 1 + v_references + v_translations;
END
$$;
