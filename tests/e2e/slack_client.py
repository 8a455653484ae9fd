"""Slack, as the Slack test (tests/e2e/team.rs) needs it, with Slack's official SDK (slack_sdk,
pinned by scripts/slack-sdk.sh): reads a card's Block Kit message with the SDK's models, and
presses a button the way Slack does — a signed `block_actions` interaction.

    slack_client.py message PORT TOKEN RUN_ID [TEAM CHANNEL]
    slack_client.py press PORT SECRET TEAM USER ACTION_ID VALUE [AGE_SECS]

Each prints one JSON object on stdout.
"""

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from slack_sdk.models.blocks import ActionsBlock, Block, ButtonElement, SectionBlock
from slack_sdk.signature import SignatureVerifier


def message(port, token, run_id, team=None, channel=None):
    query = f"?{urllib.parse.urlencode({'team': team, 'channel': channel})}" if channel else ""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/runs/{run_id}/slack-message{query}",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = json.loads(response.read())
    blocks = Block.parse_all(raw["blocks"])
    section = next(b for b in blocks if isinstance(b, SectionBlock))
    actions = next(b for b in blocks if isinstance(b, ActionsBlock))
    buttons = {
        e.action_id: e.value for e in actions.elements if isinstance(e, ButtonElement) and e.value
    }
    # The SDK's models validate what they parse: a message Slack would refuse fails here.
    for b in blocks:
        b.validate_json()
    previews = [
        b.text.text
        for b in blocks
        if isinstance(b, SectionBlock) and (b.block_id or "").startswith("countersign_preview_")
    ]
    return {
        "text": raw["text"],
        "section": section.text.text,
        "previews": previews,
        "buttons": buttons,
        "raw": raw,
    }


def press(port, secret, team, user, action_id, value, age):
    now = int(time.time()) - age
    payload = {
        "type": "block_actions",
        "team": {"id": team, "domain": "example"},
        "user": {"id": user, "team_id": team},
        "actions": [
            {
                "type": "button",
                "block_id": "countersign_decide",
                "action_id": action_id,
                "value": value,
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }
    body = urllib.parse.urlencode({"payload": json.dumps(payload)})
    timestamp = str(now)
    signature = SignatureVerifier(signing_secret=secret).generate_signature(
        timestamp=timestamp, body=body
    )
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/slack/interactions",
        data=body.encode(),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": signature,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return {"status": response.status, "body": json.loads(response.read() or b"null")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": json.loads(e.read() or b"null")}


def main(argv):
    if argv[1] == "message":
        out = message(argv[2], argv[3], argv[4], *argv[5:7])
    elif argv[1] == "press":
        age = int(argv[8]) if len(argv) > 8 else 0
        out = press(argv[2], argv[3], argv[4], argv[5], argv[6], argv[7], age)
    else:
        raise SystemExit(f"unknown command {argv[1]}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
