-- The demo site: a small two-language site the demo and the tests run against.
--
-- Ids are fixed so that examples, tests and documentation can name records; every insert is
-- `ON CONFLICT DO NOTHING`, so seeding twice changes nothing, and the identity sequences are
-- moved past the fixed ids at the end so that new records never collide with them.
--
-- What the records are for:
--   page 12 "Home"            the page the examples edit; element 5 "Teaser" on it has 2 images
--   page 16 "Old campaign"    deleted (and so is everything below it, e.g. page 17)
--   page 18 "Summer sale"     a draft version in workspace 1
--   page 20 "Intranet"        a second tree, outside every non-admin's page mounts
--   pages 40, 41              German translations of 12 and 13
--   file 7 "hero.jpg"         metadata in the default language with an empty alternative text
--   file 10 "logo.svg"        no metadata record at all
--   file 11 "payroll.pdf"     outside every non-admin's file mounts
--   file 13 "bicycle.png"     metadata only as a draft version in workspace 1
--
-- Users:
--   admin       everything
--   editor      page mount 10, file mounts fileadmin:/images/, fileadmin:/documents/ and
--               media:/, languages English and German, the SEO field grants
--   approver    holds agent_approve; no page or file mounts, English only
--   restricted  an editor without the SEO field grants: page mount 10, fileadmin:/images/,
--               English only

INSERT INTO content.languages (uid, title, iso_code) VALUES
    (0, 'English', 'en'),
    (1, 'German', 'de')
ON CONFLICT DO NOTHING;

INSERT INTO content.storages (uid, name) VALUES
    (1, 'fileadmin'),
    (2, 'media')
ON CONFLICT DO NOTHING;

INSERT INTO content.users (uid, name, admin, grants, allowed_languages, page_mounts, field_grants) VALUES
    (1, 'admin', true, '{}', '{}', '{}', '{}'),
    (2, 'editor', false, '{}', '{0,1}', '{10}',
        '{pages:seo_title,pages:og_title,pages:og_description,pages:twitter_title,pages:twitter_description}'),
    (3, 'approver', false, '{agent_approve}', '{0}', '{}', '{}'),
    (4, 'restricted', false, '{}', '{0}', '{10}', '{}')
ON CONFLICT DO NOTHING;

INSERT INTO content.file_mounts (uid, user_uid, storage, path_prefix) VALUES
    (1, 2, 1, '/images/'),
    (2, 2, 1, '/documents/'),
    (3, 2, 2, '/'),
    (4, 4, 1, '/images/')
ON CONFLICT DO NOTHING;

INSERT INTO content.exclude_fields (table_name, field) VALUES
    ('pages', 'seo_title'),
    ('pages', 'og_title'),
    ('pages', 'og_description'),
    ('pages', 'twitter_title'),
    ('pages', 'twitter_description'),
    ('file_metadata', 'title')
ON CONFLICT DO NOTHING;

INSERT INTO content.pages
    (uid, pid, sorting, language, l10n_parent, workspace, deleted, hidden, title, subtitle,
     nav_title, description, keywords, seo_title)
VALUES
    (10, 0, 256, 0, NULL, 0, false, false, 'countersign demo', '', '', '', '', ''),
    (12, 10, 256, 0, NULL, 0, false, false, 'Home', 'Start here', '',
        'Welcome to the countersign demo site, where every change an agent proposes is '
        'countersigned by a human before it is written to the page you are reading now.',
        'demo, countersign', 'Home | countersign demo'),
    (13, 10, 512, 0, NULL, 0, false, false, 'About us', '', 'About', 'Who we are.', '', ''),
    (14, 10, 768, 0, NULL, 0, false, false, 'Products', '', '', 'What we sell.', '', ''),
    (15, 14, 256, 0, NULL, 0, false, false, 'Bicycles', '', '', 'Our bicycles.', '', ''),
    (16, 10, 1024, 0, NULL, 0, true, false, 'Old campaign', '', '', '', '', ''),
    (17, 16, 256, 0, NULL, 0, false, false, 'Campaign details', '', '', '', '', ''),
    (18, 10, 1280, 0, NULL, 1, false, false, 'Summer sale', '', '', 'A draft.', '', ''),
    (20, 0, 512, 0, NULL, 0, false, false, 'Intranet', '', '', '', '', ''),
    (21, 20, 256, 0, NULL, 0, false, false, 'Staff notes', '', '', 'Internal only.', '', ''),
    (40, 10, 256, 1, 12, 0, false, false, 'Startseite', '', '', 'Willkommen.', '', ''),
    (41, 10, 512, 1, 13, 0, false, false, 'Über uns', '', '', 'Wer wir sind.', '', '')
ON CONFLICT DO NOTHING;

INSERT INTO content.elements
    (uid, pid, ctype, header, bodytext, colpos, sorting, hidden, deleted, language, l10n_parent,
     workspace)
VALUES
    (4, 12, 'text', 'Welcome', 'Hello and welcome.', 0, 128, false, false, 0, NULL, 0),
    (5, 12, 'textpic', 'Teaser', 'Ride into spring with our new bicycles.', 0, 256, false, false,
        0, NULL, 0),
    (6, 12, 'text', 'Opening hours', 'Monday to Friday, 9 to 18.', 1, 256, false, false, 0, NULL, 0),
    (7, 12, 'text', 'Old news', 'Gone.', 0, 512, false, true, 0, NULL, 0),
    (8, 13, 'textpic', 'Our story', 'It began with one bicycle.', 0, 256, false, false, 0, NULL, 0),
    (9, 21, 'text', 'Staff only', 'Salaries are paid on the 25th.', 0, 256, false, false, 0, NULL, 0),
    (11, 12, 'text', 'Draft teaser', 'Not yet.', 0, 384, false, false, 0, NULL, 1),
    (44, 12, 'text', 'Willkommen', 'Hallo und willkommen.', 0, 128, false, false, 1, 4, 0)
ON CONFLICT DO NOTHING;

INSERT INTO content.files (uid, storage, identifier, name, extension) VALUES
    (7, 1, '/images/hero.jpg', 'hero.jpg', 'jpg'),
    (8, 1, '/images/team.jpg', 'team.jpg', 'jpg'),
    (9, 1, '/documents/brochure.pdf', 'brochure.pdf', 'pdf'),
    (10, 1, '/images/logo.svg', 'logo.svg', 'svg'),
    (11, 1, '/internal/payroll.pdf', 'payroll.pdf', 'pdf'),
    (12, 2, '/videos/intro.mp4', 'intro.mp4', 'mp4'),
    (13, 2, '/products/bicycle.png', 'bicycle.png', 'png')
ON CONFLICT DO NOTHING;

INSERT INTO content.file_metadata
    (uid, file, language, l10n_parent, workspace, title, description, alternative)
VALUES
    (1, 7, 0, NULL, 0, 'Hero', 'A bicycle leaning against a wall.', ''),
    (2, 7, 1, 1, 0, 'Held', 'Ein Fahrrad an einer Wand.', 'Ein rotes Fahrrad'),
    (3, 8, 0, NULL, 0, 'Team', '', 'The team in front of the shop'),
    (4, 9, 0, NULL, 0, 'Brochure', 'The spring brochure.', ''),
    (5, 11, 0, NULL, 0, 'Payroll', '', ''),
    (6, 12, 0, NULL, 0, 'Intro video', '', ''),
    (7, 13, 0, NULL, 1, 'Bicycle', '', 'A draft alternative text')
ON CONFLICT DO NOTHING;

INSERT INTO content.reference_field_extensions (field, extension) VALUES
    ('image', 'gif'), ('image', 'jpeg'), ('image', 'jpg'), ('image', 'png'), ('image', 'svg'),
    ('image', 'webp'),
    ('assets', 'gif'), ('assets', 'jpeg'), ('assets', 'jpg'), ('assets', 'png'), ('assets', 'svg'),
    ('assets', 'webp'), ('assets', 'pdf'), ('assets', 'mp4'), ('assets', 'webm'), ('assets', 'mp3'),
    ('media', 'mp4'), ('media', 'webm'), ('media', 'mp3'), ('media', 'ogg')
ON CONFLICT DO NOTHING;

INSERT INTO content.file_references
    (uid, element, field, file, sorting, title, alternative, description, deleted)
VALUES
    (1, 5, 'image', 7, 1, '', 'A red bicycle', '', false),
    (2, 5, 'image', 8, 2, '', '', '', false),
    (3, 5, 'image', 12, 3, '', '', '', true),
    (4, 8, 'image', 8, 1, 'The team', '', '', false)
ON CONFLICT DO NOTHING;

SELECT setval(pg_get_serial_sequence('content.users', 'uid'),
              greatest((SELECT max(uid) FROM content.users), 100));
SELECT setval(pg_get_serial_sequence('content.storages', 'uid'),
              greatest((SELECT max(uid) FROM content.storages), 100));
SELECT setval(pg_get_serial_sequence('content.file_mounts', 'uid'),
              greatest((SELECT max(uid) FROM content.file_mounts), 100));
SELECT setval(pg_get_serial_sequence('content.pages', 'uid'),
              greatest((SELECT max(uid) FROM content.pages), 100));
SELECT setval(pg_get_serial_sequence('content.elements', 'uid'),
              greatest((SELECT max(uid) FROM content.elements), 100));
SELECT setval(pg_get_serial_sequence('content.files', 'uid'),
              greatest((SELECT max(uid) FROM content.files), 100));
SELECT setval(pg_get_serial_sequence('content.file_metadata', 'uid'),
              greatest((SELECT max(uid) FROM content.file_metadata), 100));
SELECT setval(pg_get_serial_sequence('content.file_references', 'uid'),
              greatest((SELECT max(uid) FROM content.file_references), 100));
