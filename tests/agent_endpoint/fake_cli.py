"""A stand-in for a command-line agent (standard library only), run by the CLI-agent tests as
``python -I -S fake_cli.py BEHAVIOUR TOKEN`` with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``PROOF_HEADERS`` (the
trajectory's proof headers, as JSON) set:

- ``agent``: one chat-completions request offering a ``bash`` tool, runs the command the model calls in its working
  directory, sends the result back, and prints the model's last text;
- ``crash``: exits 3 at once, without a request;
- ``refused``: sends a request the endpoint refuses (its last message an assistant's), prints the error, exits 1;
- ``hang``: sleeps for an hour;
- ``flood``: writes to its standard output without end;
- ``fails-after``: acts as ``agent``, then exits 2;
- ``background``: starts a daemon (double fork, ``setsid``) that sleeps for an hour, then acts as ``agent``;
- ``probe``: reports, one line each, whether it can read ``PROBE_FILE`` and connect to ``127.0.0.1:PROBE_PORT``
  (its environment), then acts as ``agent``.

The second argument, a token of the test session, is on the command line of every process it starts, so the tests
find any left running.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a bash command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def chat(messages):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
        data=json.dumps({"model": "policy", "messages": messages, "tools": [BASH]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json",
                 **json.loads(os.environ["PROOF_HEADERS"])})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())["choices"][0]["message"]


def agent():
    messages = [{"role": "user", "content": "Do the task."}]
    for _ in range(4):
        message = chat(messages)
        messages.append(message)
        if not message.get("tool_calls"):
            print(message.get("content") or "")
            return
        for call in message["tool_calls"]:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})


def background():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            subprocess.Popen([sys.executable, "-I", "-S", "-c", f"import time; time.sleep(3600)  # {sys.argv[2]}"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os._exit(0)
    os.wait()
    agent()


def probe():
    try:
        with open(os.environ["PROBE_FILE"]) as fh:
            print("read:", fh.read().strip())
    except OSError as exc:
        print("cannot read:", type(exc).__name__)
    try:
        socket.create_connection(("127.0.0.1", int(os.environ["PROBE_PORT"])), timeout=5).close()
        print("connected")
    except OSError as exc:
        print("cannot connect:", type(exc).__name__)
    agent()


def refused():
    try:
        chat([{"role": "tool", "tool_call_id": "nowhere", "content": "x"}, {"role": "assistant", "content": "x"}])
    except urllib.error.HTTPError as exc:
        print(f"error {exc.code}: {exc.read().decode()}", file=sys.stderr)
        sys.exit(1)


def main():
    behaviour = sys.argv[1]
    if behaviour == "crash":
        sys.exit(3)
    if behaviour == "hang":
        time.sleep(3600)
    if behaviour == "flood":
        line = b"x" * 4095 + b"\n"
        while True:
            sys.stdout.buffer.write(line)
    {"agent": agent, "fails-after": agent, "background": background, "probe": probe, "refused": refused}[behaviour]()
    if behaviour == "fails-after":
        sys.exit(2)


main()
