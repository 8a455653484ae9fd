"""A webhook receiver as an approver's chat bridge would run one, for tests/e2e/webhooks.rs.

Verifies every delivery with the Standard Webhooks reference library (`standardwebhooks`, from
PyPI) and the endpoint's secret, answers 500 to the first delivery of each message (so the
sender must retry) and 204 to later ones, and appends one JSON line per request to LOG:
the message id, whether it verified, the status answered and the body.

    python webhook_receiver.py SECRET PORT LOG [CERT KEY]

With CERT and KEY (PEM files) it serves HTTPS with that certificate. It writes LOG.ready once
it listens.
"""

import json
import ssl
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

secret, port, log = sys.argv[1:4]
tls = sys.argv[4:6]
webhook = Webhook(secret)
answered = set()


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            webhook.verify(body, headers)
            verified = True
        except WebhookVerificationError:
            verified = False
        message = headers.get("webhook-id")
        if not verified:
            status = 400
        elif message in answered:
            status = 204
        else:
            answered.add(message)
            status = 500
        with open(log, "a") as out:
            out.write(json.dumps({"id": message, "verified": verified, "status": status,
                                  "body": body.decode()}) + "\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", int(port)), Receiver)
if tls:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*tls)
    server.socket = context.wrap_socket(server.socket, server_side=True)
open(log + ".ready", "w").close()
server.serve_forever()
