package io.github.outboxrelay.writer;

import java.lang.reflect.Method;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.UUID;

/**
 * The Java writer against a real PostgreSQL with the outbox schema (run_tests.sh starts one and
 * sets OUTBOX_TEST_DATABASE_URL): atomicity with the caller's business write, batches, every
 * argument, trace context, and each bad input refused with the argument named and nothing
 * written. A small runner (no test framework needed): every public void test*() method runs;
 * the exit code is the number of failures.
 */
public final class WriterTest {
  static final String TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  static String url;

  public static void main(String[] args) throws Exception {
    url = System.getenv("OUTBOX_TEST_DATABASE_URL");
    if (url == null || url.isEmpty()) {
      System.out.println("SKIP: run through sdk/java/run_tests.sh (needs a database)");
      return;
    }
    int failures = 0;
    for (Method m : WriterTest.class.getDeclaredMethods()) {
      if (!m.getName().startsWith("test")) continue;
      try {
        reset();
        m.invoke(null);
        System.out.println("PASS " + m.getName());
      } catch (java.lang.reflect.InvocationTargetException e) {
        failures++;
        System.out.println("FAIL " + m.getName() + ": " + e.getCause());
        e.getCause().printStackTrace(System.out);
      }
    }
    System.out.println(failures == 0 ? "OK" : failures + " FAILED");
    System.exit(failures);
  }

  static Connection connect() throws SQLException {
    return DriverManager.getConnection(url);
  }

  static void check(boolean ok, String what) {
    if (!ok) throw new AssertionError(what);
  }

  static void reset() throws SQLException {
    try (Connection c = connect(); Statement s = c.createStatement()) {
      s.execute("TRUNCATE outbox.messages");
      s.execute("CREATE TABLE IF NOT EXISTS app_orders (id int PRIMARY KEY, state text)");
      s.execute("TRUNCATE app_orders");
    }
  }

  static List<Map<String, Object>> rows() throws SQLException {
    List<Map<String, Object>> out = new ArrayList<>();
    try (Connection c = connect(); Statement s = c.createStatement();
        ResultSet rs = s.executeQuery(
            "SELECT id, destination, ordering_key, idempotency_key::text AS ikey, event_type, "
                + "headers::text AS headers, payload::text AS payload, payload_bytes, "
                + "deliver_after, created_at FROM outbox.messages ORDER BY id")) {
      while (rs.next()) {
        Map<String, Object> r = new java.util.HashMap<>();
        r.put("id", rs.getLong("id"));
        r.put("destination", rs.getString("destination"));
        r.put("key", rs.getString("ordering_key"));
        r.put("ikey", rs.getString("ikey"));
        r.put("event_type", rs.getString("event_type"));
        r.put("headers", rs.getString("headers"));
        r.put("payload", rs.getString("payload"));
        r.put("bytes", rs.getBytes("payload_bytes"));
        r.put("deliver_after", rs.getTimestamp("deliver_after").toInstant());
        r.put("created_at", rs.getTimestamp("created_at").toInstant());
        out.add(r);
      }
    }
    return out;
  }

  static void execute(Connection c, String sql) throws SQLException {
    try (Statement s = c.createStatement()) {
      s.execute(sql);
    }
  }

  public static void testCommitsWithTheBusinessWriteAndRollsBackWithIt() throws Exception {
    long id;
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      execute(c, "INSERT INTO app_orders VALUES (1, 'paid')");
      id = OutboxWriter.publish(c, OutboxMessage.to("orders").json("{\"order\": 1}").key("order-1").build());
      c.commit();
      execute(c, "INSERT INTO app_orders VALUES (2, 'paid')");
      OutboxWriter.publish(c, OutboxMessage.to("orders").json("{\"order\": 2}").key("order-2").build());
      c.rollback();
    }
    List<Map<String, Object>> got = rows();
    check(got.size() == 1 && (long) got.get(0).get("id") == id, "only the committed message: " + got);
    try (Connection c = connect(); Statement s = c.createStatement();
        ResultSet rs = s.executeQuery("SELECT count(*) FROM app_orders")) {
      rs.next();
      check(rs.getInt(1) == 1, "the rolled-back order is gone");
    }
  }

  public static void testEveryArgumentIsStored() throws Exception {
    Instant later = Instant.now().plus(2, ChronoUnit.HOURS).truncatedTo(ChronoUnit.MICROS);
    UUID key = UUID.randomUUID();
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      OutboxWriter.publish(c, OutboxMessage.to("orders").json("{\"a\": [1, 2], \"b\": \"x\\\"y\"}")
          .key("k1").header("tenant", "acme").eventType("order.paid").deliverAt(later)
          .idempotencyKey(key).traceContext(TRACEPARENT, "congo=t61rcWkgMzE").build());
      OutboxWriter.publish(c, OutboxMessage.to("files").bytes(new byte[] {0, (byte) 0xff, 'r'})
          .deliverAfter(Duration.ofMinutes(5)).build());
      c.commit();
    }
    List<Map<String, Object>> got = rows();
    Map<String, Object> j = got.get(0);
    check("orders".equals(j.get("destination")) && "k1".equals(j.get("key"))
        && key.toString().equals(j.get("ikey")) && "order.paid".equals(j.get("event_type")), "fields " + j);
    check(("{\"tenant\": \"acme\", \"tracestate\": \"congo=t61rcWkgMzE\", \"traceparent\": \"" + TRACEPARENT + "\"}")
        .equals(j.get("headers")), "headers " + j.get("headers"));
    check("{\"a\": [1, 2], \"b\": \"x\\\"y\"}".equals(j.get("payload")), "payload " + j.get("payload"));
    check(j.get("bytes") == null, "no bytes for JSON");
    check(later.equals(j.get("deliver_after")), "deliver_after " + j.get("deliver_after") + " vs " + later);
    Map<String, Object> b = got.get(1);
    check(Arrays.equals(new byte[] {0, (byte) 0xff, 'r'}, (byte[]) b.get("bytes")), "bytes");
    check(b.get("payload") == null && b.get("key") == null, "bytes row " + b);
    check(Duration.between((Instant) b.get("created_at"), (Instant) b.get("deliver_after"))
        .compareTo(Duration.ofMinutes(4)) > 0, "deliverAfter");
  }

  public static void testABatchIsWrittenInOrderInOneStatement() throws Exception {
    List<OutboxMessage> batch = new ArrayList<>();
    for (int i = 0; i < 50; i++) {
      batch.add(OutboxMessage.to("orders").json("{\"n\": " + i + "}").key("k" + (i % 3)).build());
    }
    batch.add(OutboxMessage.to("files").bytes(new byte[] {1, 2}).header("h", "v")
        .traceContext(TRACEPARENT, null).build());
    long[] ids;
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      ids = OutboxWriter.publishMany(c, batch);
      c.commit();
    }
    check(ids.length == 51, "51 ids");
    for (int i = 1; i < ids.length; i++) check(ids[i] > ids[i - 1], "ids in input order");
    List<Map<String, Object>> got = rows();
    for (int i = 0; i < 50; i++) check(("{\"n\": " + i + "}").equals(got.get(i).get("payload")), "row " + i);
    check(("{\"h\": \"v\", \"traceparent\": \"" + TRACEPARENT + "\"}").equals(got.get(50).get("headers")),
        "last headers " + got.get(50).get("headers"));
    try (Connection c = connect()) {
      check(OutboxWriter.publishMany(c, List.of()).length == 0, "empty batch: nothing to write");
    }
  }

  /**
   * The provider's trace context never refuses a message: a legal tracestate over the
   * database's 512 bytes, or a malformed traceparent from a custom propagator, aborted the
   * caller's transaction over telemetry it never passed (review). Such a tracestate is
   * dropped, and both when the traceparent is malformed.
   */
  public static void testTheProvidersTraceContextNeverRefusesTheMessage() throws Exception {
    String longState = String.join(",", java.util.Collections.nCopies(14, "v=" + "x".repeat(40)));
    List<Map<String, String>> contexts = List.of(
        Map.of("traceparent", TRACEPARENT, "tracestate", longState),
        Map.of("traceparent", "00-abc", "tracestate", "k=v"),
        Map.of("traceparent", TRACEPARENT, "tracestate", "k=v"));
    List<String> stored = List.of("{\"traceparent\": \"" + TRACEPARENT + "\"}", "{}",
        "{\"tracestate\": \"k=v\", \"traceparent\": \"" + TRACEPARENT + "\"}");
    try {
      for (int i = 0; i < contexts.size(); i++) {
        for (boolean many : new boolean[] {false, true}) {
          reset();
          Map<String, String> context = contexts.get(i);
          OutboxWriter.setTraceContextProvider(() -> context);
          try (Connection c = connect()) {
            c.setAutoCommit(false);
            if (many) {
              OutboxWriter.publishMany(c, List.of(OutboxMessage.to("orders").json("1").build()));
            } else {
              OutboxWriter.publish(c, OutboxMessage.to("orders").json("1").build());
            }
            c.commit();
          }
          Object got = rows().get(0).get("headers");
          check(stored.get(i).equals(got), i + " many " + many + ": stored " + got);
        }
      }
      // A trace context header of its own in any case (a framework's "Traceparent"): the
      // provider's was added next to it (review). And none past the database's 64 headers.
      OutboxWriter.setTraceContextProvider(() -> Map.of("traceparent", TRACEPARENT, "tracestate", "k=v"));
      reset();
      OutboxMessage.Builder crowded = OutboxMessage.to("orders").json("2");
      for (int h = 0; h < 63; h++) crowded.header("h" + h, "v");
      try (Connection c = connect()) {
        c.setAutoCommit(false);
        OutboxWriter.publishMany(c, List.of(
            OutboxMessage.to("orders").json("1").header("Traceparent", TRACEPARENT).build(),
            crowded.build()));
        c.commit();
      }
      List<Map<String, Object>> got = rows();
      check(("{\"Traceparent\": \"" + TRACEPARENT + "\"}").equals(got.get(0).get("headers")),
          "its own Traceparent: stored " + got.get(0).get("headers"));
      check(!String.valueOf(got.get(1).get("headers")).contains("traceparent"),
          "past 64 headers: stored " + got.get(1).get("headers"));
    } finally {
      OutboxWriter.setTraceContextProvider(null);
    }
  }

  public static void testTraceContextFromTheProvider() throws Exception {
    OutboxWriter.setTraceContextProvider(() -> Map.of("traceparent", TRACEPARENT));
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      OutboxWriter.publish(c, OutboxMessage.to("orders").json("1").build());
      c.commit();
    } finally {
      OutboxWriter.setTraceContextProvider(null);
    }
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      OutboxWriter.publish(c, OutboxMessage.to("orders").json("2").build());
      c.commit();
    }
    List<Map<String, Object>> got = rows();
    check(("{\"traceparent\": \"" + TRACEPARENT + "\"}").equals(got.get(0).get("headers")), "provided");
    check("{}".equals(got.get(1).get("headers")), "no OpenTelemetry: none " + got.get(1).get("headers"));
  }

  /**
   * A header set twice kept the last value, silently; so did a traceContext(...) (the headers
   * "traceparent" and "tracestate") given with header("traceparent", ...). The C++ SDK refuses
   * both; build() now does too, before anything is written.
   */
  public static void testAHeaderSetTwiceIsRefused() throws Exception {
    String other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    Map<String, java.util.function.Supplier<OutboxMessage.Builder>> cases = new java.util.LinkedHashMap<>();
    cases.put("a", () -> OutboxMessage.to("orders").json("1").header("a", "1").header("a", "2"));
    cases.put("a ", () -> OutboxMessage.to("orders").json("1").header("a", "1").header("a", "1"));
    cases.put("traceparent", () -> OutboxMessage.to("orders").json("1")
        .header("traceparent", other).traceContext(TRACEPARENT, null));
    cases.put("traceparent ", () -> OutboxMessage.to("orders").json("1")
        .traceContext(TRACEPARENT, "").header("traceparent", other));
    cases.put("traceparent  ", () -> OutboxMessage.to("orders").json("1")
        .traceContext(TRACEPARENT, null).traceContext(other, null));
    cases.put("tracestate", () -> OutboxMessage.to("orders").json("1")
        .header("tracestate", "a=1").traceContext(TRACEPARENT, "congo=t61rcWkgMzE"));
    for (Map.Entry<String, java.util.function.Supplier<OutboxMessage.Builder>> e : cases.entrySet()) {
      String want = "header \"" + e.getKey().trim() + "\" is set twice";
      try {
        e.getValue().get().build();
        throw new AssertionError("built: " + want);
      } catch (IllegalArgumentException expected) {
        check(expected.getMessage().contains(want) && expected.getMessage().contains("set each header once")
            && expected.getMessage().contains("orders"), "\"" + expected.getMessage() + "\" lacks " + want);
      }
    }
    check(rows().isEmpty(), "nothing written");
    // The provider fills in only a message with neither: not a conflict.
    OutboxWriter.setTraceContextProvider(() -> Map.of("traceparent", other, "tracestate", "otel=1"));
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      OutboxWriter.publishMany(c, List.of(
          OutboxMessage.to("orders").json("1").header("traceparent", TRACEPARENT).build(),
          OutboxMessage.to("orders").json("2").traceContext(TRACEPARENT, null).build(),
          OutboxMessage.to("orders").json("3").build(),
          // A tracestate header of its own: the provider's did not replace it (review).
          OutboxMessage.to("orders").json("4").header("tracestate", "mine=1").build()));
      c.commit();
    } finally {
      OutboxWriter.setTraceContextProvider(null);
    }
    List<Map<String, Object>> got = rows();
    String mine = "{\"traceparent\": \"" + TRACEPARENT + "\"}";
    check(mine.equals(got.get(0).get("headers")), "a header: " + got.get(0).get("headers"));
    check(mine.equals(got.get(1).get("headers")), "traceContext: " + got.get(1).get("headers"));
    check(("{\"tracestate\": \"otel=1\", \"traceparent\": \"" + other + "\"}").equals(got.get(2).get("headers")),
        "provided: " + got.get(2).get("headers"));
    check("{\"tracestate\": \"mine=1\"}".equals(got.get(3).get("headers")),
        "a tracestate header of its own: " + got.get(3).get("headers"));
  }

  static void refused(OutboxMessage m, String text, boolean many) throws Exception {
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      execute(c, "INSERT INTO app_orders VALUES (9, 'paid')");
      try {
        if (many) {
          OutboxWriter.publishMany(c, List.of(OutboxMessage.to("orders").json("{}").build(), m));
        } else {
          OutboxWriter.publish(c, m);
        }
        throw new AssertionError("not refused: " + text);
      } catch (InvalidMessageException e) {
        check(e.getMessage().contains(text), "\"" + e.getMessage() + "\" lacks \"" + text + "\"");
      }
      c.rollback();
    }
    check(rows().isEmpty(), "nothing half-written");
  }

  public static void testBadInputIsRefusedNamingTheArgument() throws Exception {
    refused(OutboxMessage.to("").json("{}").build(), "destination must not be empty", false);
    refused(OutboxMessage.to("orders").json("{}").key("k".repeat(1025)).build(),
        "ordering_key is 1025 bytes long, the limit is 1024", false);
    refused(OutboxMessage.to("orders").json("{}").deliverAfter(Duration.ofDays(400)).build(),
        "is more than 1 year ahead", false);
    refused(OutboxMessage.to("orders").bytes(new byte[1024 * 1024 + 1]).build(),
        "payload is 1048577 bytes, the limit is 1048576", false);
    refused(OutboxMessage.to("orders").json("{}").traceContext("00-abc", null).build(),
        "header \"traceparent\" is not a W3C traceparent", false);
    refused(OutboxMessage.to("orders").json("{}").eventType("t".repeat(256)).build(),
        "event_type is 256 bytes long, the limit is 255", true);
    refused(OutboxMessage.to("orders").json("1").idempotencyKey("not-a-uuid").build(), "not-a-uuid", false);
    // Valid JSON with a number jsonb cannot store: the database's refusal (22003) came as the
    // driver's SQLException, not an InvalidMessageException.
    for (boolean many : new boolean[] {false, true}) {
      refused(OutboxMessage.to("orders").json("[1e1000000]").build(), "value overflows numeric format", many);
    }
    // Valid JSON nested deeper than the server's stack allows: its refusal (54001) is the
    // message's own too.
    String deep = "[".repeat(100000) + "]".repeat(100000);
    for (boolean many : new boolean[] {false, true}) {
      refused(OutboxMessage.to("orders").json(deep).build(), "stack depth limit exceeded", many);
    }
    UUID key = UUID.randomUUID();
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      OutboxWriter.publish(c, OutboxMessage.to("orders").json("1").idempotencyKey(key).build());
      try {
        OutboxWriter.publish(c, OutboxMessage.to("orders").json("1").idempotencyKey(key).build());
        throw new AssertionError("a key queued twice was accepted");
      } catch (InvalidMessageException e) {
        check(e.getMessage().contains("idempotency key " + key + " is already queued"), e.getMessage());
      }
      c.rollback();
    }
    // Refused before the database is asked.
    for (Runnable bad : List.<Runnable>of(
        () -> OutboxMessage.to("orders").build(),
        () -> OutboxMessage.to("orders").json("1").bytes(new byte[1]).build(),
        () -> OutboxMessage.to("orders").json("1").deliverAt(Instant.now()).deliverAfter(Duration.ZERO).build(),
        // A negative delay went in as a time in the past (due at once), where C++ refuses it.
        () -> OutboxMessage.to("orders").json("1").deliverAfter(Duration.ofMinutes(-1)).build(),
        // A tracestate without its traceparent was dropped without a word.
        () -> OutboxMessage.to("orders").json("1").traceContext(null, "congo=t61rcWkgMzE").build())) {
      try {
        bad.run();
        throw new AssertionError("built");
      } catch (IllegalArgumentException expected) {
        check(expected.getMessage().contains("orders"), expected.getMessage());
      }
    }
  }

  /**
   * JSON text that is not JSON is refused by build(), naming the payload and where it goes
   * wrong, as Python, Go and Node do: the database refused it, aborting the caller's
   * transaction, with no message or field named (review).
   */
  public static void testJsonThatIsNotJsonIsRefusedBeforeTheDatabaseIsAsked() throws Exception {
    for (String bad : List.of("{\"a\": 1, \"destination\": \"other\"", "", " ", "{oops}", "[1,]",
        "{\"a\" 1}", "{\"a\": 1,}", "01", "1.", "-", "1e", ".5", "tru", "nul", "\"abc", "\"a\tb\"",
        "\"\\x\"", "\"\\u12\"", "[1] [2]", "\uFEFF{}", "{\"a\": [1, 2}", "[[[]]", "{1: 2}", "NaN")) {
      try {
        OutboxMessage.to("orders").json(bad).build();
        throw new AssertionError("built: " + bad);
      } catch (IllegalArgumentException expected) {
        check(expected.getMessage().contains("message to \"orders\": payload is not valid JSON"),
            bad + ": " + expected.getMessage());
      }
    }
    List<String> good = List.of("{}", "[]", " 1 ", "-0.5e+10", "12345678901234567890123",
        "\"\\u00e9\\ud83d\\ude00\\n\"", "{\"a\": [true, false, null, {\"b\": \"c\"}]}",
        "[".repeat(500) + "]".repeat(500), "\"\u00e9\"");
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      for (String json : good) {
        OutboxWriter.publish(c, OutboxMessage.to("orders").json(json).build());
      }
      c.commit();
    }
    check(rows().size() == good.size(), "every valid payload is written: " + rows().size());
  }

  /** A payload's text stays a payload: it cannot add fields to the message. */
  public static void testAPayloadCannotRewriteTheMessage() throws Exception {
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      OutboxWriter.publish(c, OutboxMessage.to("orders").json("{\"destination\": \"other\"}").build());
      c.commit();
    }
    List<Map<String, Object>> got = rows();
    check("orders".equals(got.get(0).get("destination")), "destination " + got.get(0).get("destination"));
    check("{\"destination\": \"other\"}".equals(got.get(0).get("payload")), "payload");
  }

  /**
   * In autocommit mode each statement commits on its own: the message would commit without the
   * business write, or the business write without the message.
   */
  public static void testAnAutocommitConnectionIsRefused() throws Exception {
    try (Connection c = connect()) {
      check(c.getAutoCommit(), "JDBC connections start in autocommit");
      for (boolean many : new boolean[] {false, true}) {
        try {
          if (many) {
            OutboxWriter.publishMany(c, List.of(OutboxMessage.to("orders").json("1").build()));
          } else {
            OutboxWriter.publish(c, OutboxMessage.to("orders").json("1").build());
          }
          throw new AssertionError("published in autocommit mode");
        } catch (SQLException e) {
          check("25P01".equals(e.getSQLState()) && e.getMessage().contains("setAutoCommit(false)"),
              e.getSQLState() + " " + e.getMessage());
        }
      }
    }
    check(rows().isEmpty(), "nothing written on its own");
  }

  /**
   * A NUL or an unpaired surrogate: PostgreSQL text cannot hold them. pgJDBC wrote an unpaired
   * surrogate as '?' (another key, another header), and a NUL failed in the database as SQLSTATE
   * 22P05, not an InvalidMessageException, aborting the transaction.
   */
  public static void testTextPostgreSQLCannotHoldIsRefusedNamingTheField() throws Exception {
    Map<String, java.util.function.Supplier<OutboxMessage.Builder>> cases = new java.util.LinkedHashMap<>();
    cases.put("destination", () -> OutboxMessage.to("ord\u0000ers").json("1"));
    cases.put("ordering key", () -> OutboxMessage.to("orders").json("1").key("k\ud800"));
    cases.put("event type", () -> OutboxMessage.to("orders").json("1").eventType("order\u0000paid"));
    cases.put("header name", () -> OutboxMessage.to("orders").json("1").header("ten\udc00ant", "acme"));
    cases.put("header \"tenant\"", () -> OutboxMessage.to("orders").json("1").header("tenant", "ac\u0000me"));
    cases.put("payload", () -> OutboxMessage.to("orders").json("{\"a\": \"x\\u0000y\"}"));
    cases.put("payload ", () -> OutboxMessage.to("orders").json("[\"\\ud800\"]"));
    cases.put("payload  ", () -> OutboxMessage.to("orders").json("[\"\ud800\"]"));
    for (Map.Entry<String, java.util.function.Supplier<OutboxMessage.Builder>> e : cases.entrySet()) {
      String field = e.getKey().trim();
      try (Connection c = connect()) {
        c.setAutoCommit(false);
        execute(c, "INSERT INTO app_orders VALUES (9, 'paid')");
        try {
          OutboxWriter.publish(c, e.getValue().get().build());
          throw new AssertionError("published: " + field);
        } catch (IllegalArgumentException expected) {
          check(expected.getMessage().contains(field), "\"" + expected.getMessage() + "\" lacks " + field);
        } catch (SQLException notBeforeTheDatabase) {
          throw new AssertionError(field + ": " + notBeforeTheDatabase.getMessage(), notBeforeTheDatabase);
        }
        // Refused before the database was asked: the transaction goes on.
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT count(*) FROM app_orders")) {
          rs.next();
          check(rs.getInt(1) == 1, "the transaction went on");
        }
        c.rollback();
      }
    }
    check(rows().isEmpty(), "nothing written");
    // Characters outside the BMP, raw or escaped as a pair, and escapes that are only text.
    try (Connection c = connect()) {
      c.setAutoCommit(false);
      OutboxWriter.publish(c, OutboxMessage.to("orders").json("[\"\ud83d\ude00\", \"\\ud83d\\ude00\", \"\\\\u0000\"]")
          .key("\ud83d\ude00").build());
      c.commit();
    }
    Map<String, Object> r = rows().get(0);
    check("[\"\ud83d\ude00\", \"\ud83d\ude00\", \"\\\\u0000\"]".equals(r.get("payload")), "payload " + r.get("payload"));
    check("\ud83d\ude00".equals(r.get("key")), "key " + r.get("key"));
  }
}
