#!/usr/bin/env bash
# Start ActiveMQ Classic (Debian's `activemq` package) in the background with this directory's
# activemq.xml (OpenWire 61616, STOMP 61613, the statistics plugin), a small heap, and wait
# until STOMP accepts connections. Idempotent: returns at once when 61613 already answers.
#
#   tests/activemq/start.sh          start (data and log under $DLO_ACTIVEMQ_DATA)
#   tests/activemq/start.sh stop     stop the broker this script started (its pid file)
#
# Environment: DLO_ACTIVEMQ_DATA (default /tmp/dlo-activemq), DLO_ACTIVEMQ_HEAP (default 256M),
# DLO_ACTIVEMQ_WAIT seconds (default 90); for a second broker (tests): DLO_ACTIVEMQ_CONFIG (a
# configuration file instead of this directory's activemq.xml), DLO_ACTIVEMQ_STOMP_PORT and
# DLO_ACTIVEMQ_OPENWIRE_PORT (default 61613, 61616).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="${DLO_ACTIVEMQ_DATA:-/tmp/dlo-activemq}"
heap="${DLO_ACTIVEMQ_HEAP:-256M}"
wait_s="${DLO_ACTIVEMQ_WAIT:-90}"
home=/usr/share/activemq
pidfile="$data/activemq.pid"
config="${DLO_ACTIVEMQ_CONFIG:-$here/activemq.xml}"
stomp_port="${DLO_ACTIVEMQ_STOMP_PORT:-61613}"
openwire_port="${DLO_ACTIVEMQ_OPENWIRE_PORT:-61616}"

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$stomp_port") 2>/dev/null; }

if [ "${1:-start}" = stop ]; then
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"
    for _ in $(seq 1 30); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 1; done
  fi
  rm -f "$pidfile"
  exit 0
fi

if answers; then echo "ActiveMQ: STOMP already answers on 127.0.0.1:$stomp_port"; exit 0; fi
if [ ! -f "$home/bin/activemq.jar" ]; then
  echo "ActiveMQ is not installed (apt-get install -y -q activemq)" >&2
  exit 1
fi
mkdir -p "$data/conf" "$data/lib"
# STOMP's jms-map-json (how the adapter reads the statistics plugin's map messages) needs
# XStream and Jettison, which Debian's package only recommends and leaves off the broker's
# classpath; $data/lib is on its extension classpath.
for jar in xstream jettison; do
  if [ ! -f "/usr/share/java/$jar.jar" ]; then
    echo "ActiveMQ needs /usr/share/java/$jar.jar (apt-get install -y -q libxstream-java libjettison-java)" >&2
    exit 1
  fi
  ln -sf "/usr/share/java/$jar.jar" "$data/lib/$jar.jar"
done
# The broker (log4j 1.2 here) finds log4j.properties on its classpath, which is conf/.
cp "$config" "$data/conf/activemq.xml"
cp "$here/log4j.properties" "$data/conf/log4j.properties"
nohup java -Xms64M -Xmx"$heap" -XX:+UseSerialGC \
  --add-reads=java.xml=java.logging \
  --add-opens java.base/java.security=ALL-UNNAMED \
  --add-opens java.base/java.net=ALL-UNNAMED \
  --add-opens java.base/java.lang=ALL-UNNAMED \
  --add-opens java.base/java.util=ALL-UNNAMED \
  --add-opens java.naming/javax.naming.spi=ALL-UNNAMED \
  --add-opens java.rmi/sun.rmi.transport.tcp=ALL-UNNAMED \
  --add-opens java.base/java.util.concurrent=ALL-UNNAMED \
  --add-opens java.base/java.util.concurrent.atomic=ALL-UNNAMED \
  -Dactivemq.home="$home" -Dactivemq.base="$data" -Dactivemq.conf="$data/conf" \
  -Dactivemq.data="$data/data" -Dactivemq.classpath="$data/conf" \
  -Ddlo.stomp.port="$stomp_port" -Ddlo.openwire.port="$openwire_port" \
  -jar "$home/bin/activemq.jar" start "xbean:file:$data/conf/activemq.xml" \
  >>"$data/activemq.log" 2>&1 &
echo $! >"$pidfile"
for _ in $(seq 1 "$wait_s"); do
  if answers; then
    echo "ActiveMQ: STOMP answers on 127.0.0.1:$stomp_port (pid $(cat "$pidfile"))"
    exit 0
  fi
  if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then break; fi
  sleep 1
done
echo "ActiveMQ did not come up on 127.0.0.1:$stomp_port; last log lines:" >&2
tail -n 30 "$data/activemq.log" >&2
exit 1
