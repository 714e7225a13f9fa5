package io.github.outboxrelay.writer;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Supplier;

/**
 * Writes outbox-relay messages inside the caller's JDBC transaction: a message is delivered to
 * Kafka or a webhook if and only if the business write it is published with commits.
 *
 * <pre>{@code
 * conn.setAutoCommit(false);
 * try (PreparedStatement ps = conn.prepareStatement("UPDATE orders SET state = 'paid' WHERE id = ?")) {
 *   ps.setInt(1, 42);
 *   ps.executeUpdate();
 * }
 * long id = OutboxWriter.publish(conn, OutboxMessage.to("orders").json("{\"order\": 42}").build());
 * conn.commit();
 * }</pre>
 *
 * <p>Thin over the SQL function outbox.enqueue_many: the database checks every limit
 * (docs/sdk.md, "Limits"); a refused message throws {@link InvalidMessageException}.
 */
public final class OutboxWriter {
  private OutboxWriter() {}

  // 22003: a JSON number jsonb cannot store (1e1000000); 54001: JSON nested deeper than the
  // server's stack allows.
  private static final Set<String> REFUSALS =
      Set.of("22023", "54000", "23505", "22P02", "22007", "22008", "22003", "54001");

  // Each element's payload_text becomes its payload, parsed as JSON by the database.
  private static final String ENQUEUE_MANY =
      "SELECT outbox.enqueue_many((SELECT jsonb_agg(CASE WHEN e->>'payload_text' IS NOT NULL THEN "
          + "(e - 'payload_text') || jsonb_build_object('payload', (e->>'payload_text')::jsonb) "
          + "ELSE e END ORDER BY n) FROM jsonb_array_elements(?::jsonb) WITH ORDINALITY AS t(e, n)))";

  private static volatile Supplier<Map<String, String>> traceContextProvider =
      OutboxWriter::openTelemetryContext;

  /**
   * Replaces where a message without trace context gets one ({@code traceparent},
   * {@code tracestate}); null: OpenTelemetry's current span, when its API is on the classpath.
   */
  public static void setTraceContextProvider(Supplier<Map<String, String>> provider) {
    traceContextProvider = provider == null ? OutboxWriter::openTelemetryContext : provider;
  }

  /**
   * Writes {@code message} in the connection's current transaction; returns its id. A
   * connection in autocommit mode is refused (SQLException, SQLSTATE 25P01).
   */
  public static long publish(Connection conn, OutboxMessage message) throws SQLException {
    return publishMany(conn, List.of(message))[0];
  }

  /**
   * Writes every message in one statement; returns their ids in input order. The per-key
   * locks of the whole batch are taken in one global order.
   */
  public static long[] publishMany(Connection conn, List<OutboxMessage> messages) throws SQLException {
    if (messages.isEmpty()) return new long[0];
    if (conn.getAutoCommit()) {
      // Each statement would commit on its own: the message apart from the business write.
      throw new SQLException("outbox: the connection is in autocommit mode, so the message would "
          + "commit on its own, not with your business write; call conn.setAutoCommit(false), do "
          + "the business write and publish, then conn.commit()", "25P01");
    }
    StringBuilder batch = new StringBuilder("[");
    for (int i = 0; i < messages.size(); i++) {
      if (i > 0) batch.append(',');
      appendElement(batch, messages.get(i));
    }
    batch.append(']');
    long[] ids = new long[messages.size()];
    try (PreparedStatement ps = conn.prepareStatement(ENQUEUE_MANY)) {
      ps.setString(1, batch.toString());
      try (ResultSet rs = ps.executeQuery()) {
        int n = 0;
        while (rs.next()) ids[n++] = rs.getLong(1);
      }
    } catch (SQLException e) {
      if (e.getSQLState() != null && REFUSALS.contains(e.getSQLState())) {
        throw new InvalidMessageException(e);
      }
      throw e;
    }
    return ids;
  }

  private static void appendElement(StringBuilder out, OutboxMessage m) {
    out.append("{\"destination\":");
    quote(out, m.destination);
    if (m.bytes != null) {
      out.append(",\"payload_base64\":");
      quote(out, Base64.getEncoder().encodeToString(m.bytes));
    } else {
      // As a string: the statement parses it (a payload's text cannot add fields).
      out.append(",\"payload_text\":");
      quote(out, m.json);
    }
    if (m.key != null) {
      out.append(",\"ordering_key\":");
      quote(out, m.key);
    }
    Map<String, String> headers = new LinkedHashMap<>(m.headers);
    if (m.traceparent != null && !m.traceparent.isEmpty()) {
      headers.put("traceparent", m.traceparent);
      if (m.tracestate != null && !m.tracestate.isEmpty()) headers.put("tracestate", m.tracestate);
    } else if (!hasHeader(headers, "traceparent") && !hasHeader(headers, "tracestate")) {
      // Its own trace context header in any case (a framework's "Traceparent") is its own:
      // the provider's went out next to it (review). None past the database's 64 headers.
      Map<String, String> trace = ambientTraceContext(traceContextProvider.get());
      if (headers.size() + trace.size() <= MAX_HEADERS) headers.putAll(trace);
    }
    out.append(",\"headers\":{");
    boolean first = true;
    for (Map.Entry<String, String> h : headers.entrySet()) {
      if (!first) out.append(',');
      first = false;
      quote(out, h.getKey());
      out.append(':');
      quote(out, h.getValue());
    }
    out.append("},\"event_type\":");
    quote(out, m.eventType);
    Instant when = m.deliverAt;
    if (m.deliverAfter != null) when = Instant.now().plus(m.deliverAfter);
    if (when != null) {
      out.append(",\"deliver_after\":");
      quote(out, when.toString());
    }
    if (m.idempotencyKey != null) {
      out.append(",\"idempotency_key\":");
      quote(out, m.idempotencyKey);
    }
    out.append('}');
  }

  private static void quote(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"': out.append("\\\""); break;
        case '\\': out.append("\\\\"); break;
        case '\n': out.append("\\n"); break;
        case '\r': out.append("\\r"); break;
        case '\t': out.append("\\t"); break;
        default:
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }

  private static final int MAX_HEADERS = 64; // outbox.validate_message

  /** Whether `headers` has `name`, in any case (HTTP header names are case-insensitive). */
  static boolean hasHeader(Map<String, String> headers, String name) {
    for (String key : headers.keySet()) {
      if (key.equalsIgnoreCase(name)) return true;
    }
    return false;
  }

  private static final java.util.regex.Pattern W3C_TRACEPARENT =
      java.util.regex.Pattern.compile("[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}");

  /**
   * The provider's trace context as the database takes it, never a refusal: telemetry the
   * caller did not pass must not abort its transaction. A traceparent that is no W3C one drops
   * both; a tracestate over 512 bytes (legal: W3C asks to propagate at least 512) is dropped.
   */
  static Map<String, String> ambientTraceContext(Map<String, String> trace) {
    Map<String, String> out = new LinkedHashMap<>();
    if (trace == null) return out;
    String parent = trace.get("traceparent");
    String state = trace.get("tracestate");
    if (parent == null || !W3C_TRACEPARENT.matcher(parent).matches() || parent.startsWith("ff")
        || parent.substring(3, 35).equals("0".repeat(32))
        || parent.substring(36, 52).equals("0".repeat(16))) {
      return out;
    }
    out.put("traceparent", parent);
    if (state != null && !state.isEmpty() && state.indexOf('\0') < 0
        && state.getBytes(java.nio.charset.StandardCharsets.UTF_8).length <= 512) {
      out.put("tracestate", state);
    }
    return out;
  }

  /** traceparent/tracestate of OpenTelemetry's current span, or {} without OpenTelemetry. */
  static Map<String, String> openTelemetryContext() {
    Map<String, String> out = new LinkedHashMap<>();
    try {
      Class<?> span = Class.forName("io.opentelemetry.api.trace.Span");
      Object current = span.getMethod("current").invoke(null);
      Object ctx = span.getMethod("getSpanContext").invoke(current);
      Class<?> spanContext = Class.forName("io.opentelemetry.api.trace.SpanContext");
      if (!(Boolean) spanContext.getMethod("isValid").invoke(ctx)) return out;
      Object flags = spanContext.getMethod("getTraceFlags").invoke(ctx);
      String hex = (String) flags.getClass().getMethod("asHex").invoke(flags);
      out.put("traceparent", "00-" + spanContext.getMethod("getTraceId").invoke(ctx) + "-"
          + spanContext.getMethod("getSpanId").invoke(ctx) + "-" + hex);
      Object state = spanContext.getMethod("getTraceState").invoke(ctx);
      @SuppressWarnings("unchecked")
      Map<String, String> entries = (Map<String, String>) state.getClass().getMethod("asMap").invoke(state);
      if (!entries.isEmpty()) {
        List<String> parts = new ArrayList<>();
        entries.forEach((k, v) -> parts.add(k + "=" + v));
        out.put("tracestate", String.join(",", parts));
      }
    } catch (ReflectiveOperationException | LinkageError | ClassCastException e) {
      out.clear(); // no OpenTelemetry API on the classpath
    }
    return out;
  }
}
