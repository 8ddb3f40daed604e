// Message rates from the Prometheus text at /metrics: counters are summed over their labels
// and a rate is the change between two polls divided by the time between them.

// Messages accepted from publishers of any protocol (HTTP publishes included).
export const IN_COUNTERS = ["broker_messages_published_count"];
// Messages sent to consumers, per protocol.
export const OUT_COUNTERS = [
  "mqtt_messages_out_count",
  "kafka_messages_out_count",
  "amqp_messages_out_count",
];

// "name{label="v",...} value [timestamp]" lines -> Map(name -> sum of values).
export function parsePrometheus(text) {
  const totals = new Map();
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const brace = line.indexOf("{");
    const space = line.indexOf(" ");
    let name;
    let rest;
    if (brace !== -1 && (space === -1 || brace < space)) {
      name = line.slice(0, brace);
      rest = line.slice(line.lastIndexOf("}") + 1);
    } else {
      name = line.slice(0, space);
      rest = line.slice(space);
    }
    const value = Number.parseFloat(rest.trim().split(/\s+/)[0]);
    if (Number.isFinite(value)) totals.set(name, (totals.get(name) || 0) + value);
  }
  return totals;
}

export const sum = (totals, names) => names.reduce((acc, name) => acc + (totals.get(name) || 0), 0);

// Keeps the previous poll; sample() answers {inTotal, outTotal, inRate, outRate} where the
// rates are null on the first poll and after a counter went back (a restarted broker).
export class RateMeter {
  constructor() {
    this.previous = null;
  }

  sample(totals, nowMs = performance.now()) {
    const current = { t: nowMs, in: sum(totals, IN_COUNTERS), out: sum(totals, OUT_COUNTERS) };
    const previous = this.previous;
    this.previous = current;
    const rate = (key) => {
      if (!previous || current.t <= previous.t || current[key] < previous[key]) return null;
      return ((current[key] - previous[key]) * 1000) / (current.t - previous.t);
    };
    return { inTotal: current.in, outTotal: current.out, inRate: rate("in"), outRate: rate("out") };
  }
}
