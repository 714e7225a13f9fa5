package io.github.outboxrelay.writer;

import java.time.Duration;
import java.time.Instant;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.UUID;

/**
 * One outbox message, built with {@link #to(String)}: the same fields as the C++ SDK and the
 * other writers. Immutable.
 *
 * <pre>{@code
 * OutboxMessage m = OutboxMessage.to("orders")
 *     .json("{\"order\": 42}")        // or .bytes(raw)
 *     .key("order-42")                 // ordering key (optional)
 *     .eventType("order.paid")
 *     .header("tenant", "acme")
 *     .build();
 * }</pre>
 */
public final class OutboxMessage {
  final String destination;
  final String json; // JSON text, exactly as written
  final byte[] bytes;
  final String key;
  final Map<String, String> headers;
  final String eventType;
  final Instant deliverAt;
  final Duration deliverAfter;
  final String idempotencyKey;
  final String traceparent;
  final String tracestate;

  private OutboxMessage(Builder b) {
    destination = b.destination;
    json = b.json;
    bytes = b.bytes;
    key = b.key;
    headers = Collections.unmodifiableMap(new LinkedHashMap<>(b.headers));
    eventType = b.eventType;
    deliverAt = b.deliverAt;
    deliverAfter = b.deliverAfter;
    idempotencyKey = b.idempotencyKey;
    traceparent = b.traceparent;
    tracestate = b.tracestate;
  }

  /** Starts a message to {@code destination}, as named in the relay's config. */
  public static Builder to(String destination) {
    return new Builder(destination);
  }

  public String destination() {
    return destination;
  }

  public static final class Builder {
    private final String destination;
    private String json;
    private byte[] bytes;
    private String key;
    private final Map<String, String> headers = new LinkedHashMap<>();
    private String eventType = "";
    private Instant deliverAt;
    private Duration deliverAfter;
    private String idempotencyKey;
    private String traceparent;
    private String tracestate;
    private final Set<String> setTwice = new LinkedHashSet<>(); // header names; build() refuses

    private Builder(String destination) {
      this.destination = Objects.requireNonNull(destination, "destination");
    }

    /** The payload as JSON text (checked as JSON by build(); stored as the database parses it). */
    public Builder json(String jsonText) {
      this.json = Objects.requireNonNull(jsonText, "json");
      return this;
    }

    /** The payload as bytes (delivered as application/octet-stream to webhooks). */
    public Builder bytes(byte[] payload) {
      this.bytes = Objects.requireNonNull(payload, "bytes").clone();
      return this;
    }

    /** The ordering key: messages of one destination with the same key go out in order. */
    public Builder key(String orderingKey) {
      this.key = orderingKey;
      return this;
    }

    /** Adds a header. Names are unique per message: build() refuses one set twice. */
    public Builder header(String name, String value) {
      if (headers.containsKey(name)) setTwice.add(name);
      headers.put(Objects.requireNonNull(name, "header name"), Objects.requireNonNull(value, "header value"));
      return this;
    }

    public Builder eventType(String type) {
      this.eventType = Objects.requireNonNull(type, "eventType");
      return this;
    }

    /** Not before this time. */
    public Builder deliverAt(Instant when) {
      this.deliverAt = when;
      return this;
    }

    /** Not before now + this. */
    public Builder deliverAfter(Duration delay) {
      this.deliverAfter = delay;
      return this;
    }

    /** A uuid; unset: a random one. Fix it so that a retried transaction writes the same key. */
    public Builder idempotencyKey(UUID key) {
      this.idempotencyKey = key == null ? null : key.toString();
      return this;
    }

    /** The same, as text (the database checks it is a uuid). */
    public Builder idempotencyKey(String key) {
      this.idempotencyKey = key;
      return this;
    }

    /**
     * W3C trace context: the headers "traceparent" and, when not empty, "tracestate" (so
     * build() refuses it together with header("traceparent", ...), or given twice); unset: the
     * writer's TraceContextProvider (OpenTelemetry).
     */
    public Builder traceContext(String traceparent, String tracestate) {
      if (isSet(this.traceparent) && isSet(traceparent)) setTwice.add("traceparent");
      this.traceparent = traceparent;
      this.tracestate = tracestate;
      return this;
    }

    /**
     * Checks what needs no database; throws IllegalArgumentException naming the field: text
     * PostgreSQL cannot hold (a NUL, an unpaired surrogate, which pgJDBC would write as '?'),
     * in the JSON text as characters or as escapes; a header set twice (traceContext(...) sets
     * the headers "traceparent" and "tracestate").
     */
    public OutboxMessage build() {
      String where = "message to \"" + destination.replace("\u0000", "\\u0000") + "\": ";
      checkText(destination, "destination", where);
      checkText(key, "ordering key", where);
      checkText(eventType, "event type", where);
      checkText(idempotencyKey, "idempotency key", where);
      checkText(traceparent, "traceparent", where);
      checkText(tracestate, "tracestate", where);
      for (Map.Entry<String, String> h : headers.entrySet()) {
        checkText(h.getKey(), "header name", where);
        checkText(h.getValue(), "header \"" + h.getKey() + "\"", where);
      }
      // As the C++ SDK: a header set twice is refused, not silently the last value.
      if (!setTwice.isEmpty()) {
        throw new IllegalArgumentException(
            where + "header \"" + setTwice.iterator().next() + "\" is set twice; set each header once");
      }
      if (isSet(tracestate) && !isSet(traceparent)) {
        // It was dropped without a word (and the provider's trace context sent instead).
        throw new IllegalArgumentException(where + "traceContext(null, tracestate): a W3C tracestate "
            + "belongs to a traceparent; pass both, or neither");
      }
      if (isSet(traceparent)) {
        for (String name : isSet(tracestate) ? List.of("traceparent", "tracestate") : List.of("traceparent")) {
          if (OutboxWriter.hasHeader(headers, name)) {
            throw new IllegalArgumentException(where + "header \"" + name
                + "\" is set twice (by header(...) and traceContext(...)); set each header once");
          }
        }
      }
      if (json != null) {
        checkText(json, "payload", where);
        String syntax = jsonSyntaxProblem(json);
        if (syntax != null) {
          throw new IllegalArgumentException(where + "payload is not valid JSON: " + syntax
              + "; pass JSON text to json(...) or raw bytes to bytes(...)");
        }
        String problem = jsonEscapeProblem(json);
        if (problem != null) throw new IllegalArgumentException(where + "payload " + problem);
      }
      if ((json == null) == (bytes == null)) {
        throw new IllegalArgumentException(
            "message to \"" + destination + "\" needs exactly one payload: json(...) or bytes(...)");
      }
      if (deliverAt != null && deliverAfter != null) {
        throw new IllegalArgumentException(
            "message to \"" + destination + "\" sets both deliverAt and deliverAfter; keep one");
      }
      if (deliverAfter != null && deliverAfter.isNegative()) {
        throw new IllegalArgumentException(where + "deliverAfter must not be negative, got "
            + deliverAfter + "; leave it unset to deliver at once, or use deliverAt");
      }
      return new OutboxMessage(this);
    }
  }

  private static boolean isSet(String s) {
    return s != null && !s.isEmpty();
  }

  private static void checkText(String s, String what, String where) {
    if (s == null) return;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == 0) {
        throw new IllegalArgumentException(where + what
            + " contains a NUL character (\\u0000), which PostgreSQL text cannot hold; remove it");
      }
      if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
        i++;
      } else if (Character.isSurrogate(c)) {
        throw new IllegalArgumentException(where + what + " contains an unpaired surrogate (U+"
            + Integer.toHexString(c).toUpperCase() + "), which is not valid UTF-8; decode the text correctly");
      }
    }
  }

  /**
   * Why jsonb cannot hold the JSON text's escapes, or null: \\u0000 and unpaired surrogate
   * escapes are valid JSON that jsonb refuses. Backslashes only occur inside strings of valid
   * JSON, so walking the escapes is exact (invalid JSON is the database's to refuse).
   */
  static String jsonEscapeProblem(String text) {
    String unpaired = "contains an unpaired surrogate escape, which is not valid UTF-8";
    int highEnd = -1; // where a high surrogate escape ended, waiting for its low half
    for (int i = 0; i < text.length(); i++) {
      if (text.charAt(i) != '\\') continue;
      int start = i;
      i++;
      int code = -1;
      if (i < text.length() && text.charAt(i) == 'u' && i + 4 < text.length()) {
        try {
          code = Integer.parseInt(text.substring(i + 1, i + 5), 16);
        } catch (NumberFormatException e) {
          code = -1;
        }
        i += 4;
      }
      boolean low = code >= 0xDC00 && code <= 0xDFFF;
      if (highEnd >= 0 && !(low && start == highEnd)) return unpaired;
      if (code == 0) return "contains a NUL character (\\u0000), which jsonb cannot hold; remove it, or send bytes(...)";
      if (code >= 0xD800 && code <= 0xDBFF) {
        highEnd = i + 1;
      } else if (low && highEnd < 0) {
        return unpaired;
      } else {
        highEnd = -1;
      }
    }
    return highEnd >= 0 ? unpaired : null;
  }

  /**
   * Why the text is not one JSON value (RFC 8259), or null; as in Python, Go and Node, checked
   * before the database is asked, so that the caller's transaction goes on. Iterative: any
   * nesting depth is read without recursion.
   */
  static String jsonSyntaxProblem(String t) {
    StringBuilder open = new StringBuilder(); // the arrays ('[') and objects ('{') we are in
    int i = skipSpace(t, 0);
    boolean wantValue = true;
    while (true) {
      if (wantValue) {
        if (i >= t.length()) return "the text ends where a value should be";
        char c = t.charAt(i);
        if (c == '[' || c == '{') {
          open.append(c);
          i = skipSpace(t, i + 1);
          if (i < t.length() && t.charAt(i) == (c == '[' ? ']' : '}')) {
            open.setLength(open.length() - 1);
            i = skipSpace(t, i + 1);
            wantValue = false;
          } else if (c == '{') {
            i = objectKey(t, i);
            if (i < 0) return at(-i - 1, "expected an object key (a string) and ':'");
          }
          continue;
        }
        int end;
        if (c == '"') {
          end = stringEnd(t, i);
        } else if (t.startsWith("true", i) || t.startsWith("null", i)) {
          end = i + 4;
        } else if (t.startsWith("false", i)) {
          end = i + 5;
        } else {
          end = numberEnd(t, i);
        }
        if (end < 0) return at(i, "not a JSON value");
        i = skipSpace(t, end);
        wantValue = false;
        continue;
      }
      if (open.length() == 0) return i == t.length() ? null : at(i, "text after the JSON value");
      char top = open.charAt(open.length() - 1);
      char close = top == '[' ? ']' : '}';
      if (i >= t.length()) return "the text ends inside an " + (top == '[' ? "array" : "object");
      char c = t.charAt(i);
      if (c == close) {
        open.setLength(open.length() - 1);
        i = skipSpace(t, i + 1);
      } else if (c == ',') {
        i = skipSpace(t, i + 1);
        if (top == '{') {
          i = objectKey(t, i);
          if (i < 0) return at(-i - 1, "expected an object key (a string) and ':'");
        }
        wantValue = true;
      } else {
        return at(i, "expected ',' or '" + close + "'");
      }
    }
  }

  private static String at(int i, String what) {
    return what + " at character " + (i + 1);
  }

  private static int skipSpace(String t, int i) {
    while (i < t.length() && (t.charAt(i) == ' ' || t.charAt(i) == '\t' || t.charAt(i) == '\n'
        || t.charAt(i) == '\r')) {
      i++;
    }
    return i;
  }

  /** After an object key and its ':' (spaces skipped), or -(where it went wrong) - 1. */
  private static int objectKey(String t, int i) {
    int end = stringEnd(t, i);
    if (end < 0) return -i - 1;
    end = skipSpace(t, end);
    if (end >= t.length() || t.charAt(end) != ':') return -end - 1;
    return skipSpace(t, end + 1);
  }

  /** Just after the string that starts at i, or -1 when none does. */
  private static int stringEnd(String t, int i) {
    if (i >= t.length() || t.charAt(i) != '"') return -1;
    for (i++; i < t.length(); i++) {
      char c = t.charAt(i);
      if (c == '"') return i + 1;
      if (c < 0x20) return -1; // a control character must be escaped
      if (c == '\\') {
        if (++i >= t.length()) return -1;
        char e = t.charAt(i);
        if (e == 'u') {
          if (i + 4 >= t.length()) return -1;
          for (int k = 1; k <= 4; k++) {
            if (Character.digit(t.charAt(i + k), 16) < 0) return -1;
          }
          i += 4;
        } else if ("\"\\/bfnrt".indexOf(e) < 0) {
          return -1;
        }
      }
    }
    return -1;
  }

  private static boolean digit(String t, int i) {
    return i < t.length() && t.charAt(i) >= '0' && t.charAt(i) <= '9';
  }

  /** Just after the number that starts at i, or -1 when none does. */
  private static int numberEnd(String t, int i) {
    int j = i;
    if (j < t.length() && t.charAt(j) == '-') j++;
    if (!digit(t, j)) return -1;
    if (t.charAt(j) == '0') {
      j++;
    } else {
      while (digit(t, j)) j++;
    }
    if (j < t.length() && t.charAt(j) == '.') {
      if (!digit(t, ++j)) return -1;
      while (digit(t, j)) j++;
    }
    if (j < t.length() && (t.charAt(j) == 'e' || t.charAt(j) == 'E')) {
      j++;
      if (j < t.length() && (t.charAt(j) == '+' || t.charAt(j) == '-')) j++;
      if (!digit(t, j)) return -1;
      while (digit(t, j)) j++;
    }
    return j;
  }
}
