#!/bin/sh
# Start server.py in the background (once) and wait until it answers.
# The server outlives this command: it runs in its own session, with its
# output in /workspace/server.log.
cd /workspace || exit 1
PORT=${PORT:-8000}
if [ -f server.pid ] && kill -0 "$(cat server.pid)" 2>/dev/null; then
  echo "server already running (pid $(cat server.pid)) on port $PORT"
  exit 0
fi
setsid python3 server.py >server.log 2>&1 </dev/null &
echo $! >server.pid
i=0
while [ $i -lt 50 ]; do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/config', timeout=1)" 2>/dev/null; then
    echo "server started (pid $(cat server.pid)) on port $PORT"
    exit 0
  fi
  i=$((i + 1))
  sleep 0.1
done
echo "server did not answer on port $PORT within 5s:" >&2
cat server.log >&2
exit 1
