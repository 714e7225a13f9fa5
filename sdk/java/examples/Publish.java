import io.github.outboxrelay.writer.InvalidMessageException;
import io.github.outboxrelay.writer.OutboxMessage;
import io.github.outboxrelay.writer.OutboxWriter;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;

/**
 * Publishes an order's event in the same transaction as the order's update.
 * OUTBOX_JDBC_URL=jdbc:postgresql://db/app?user=app java -cp writer.jar:postgresql.jar Publish
 */
public final class Publish {
  public static void main(String[] args) throws SQLException {
    try (Connection conn = DriverManager.getConnection(System.getenv("OUTBOX_JDBC_URL"))) {
      conn.setAutoCommit(false);
      try (Statement s = conn.createStatement()) {
        s.execute("CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, state text)");
        s.execute("INSERT INTO orders VALUES (42, 'paid') ON CONFLICT (id) DO UPDATE SET state = 'paid'");
        long id = OutboxWriter.publish(conn, OutboxMessage.to("orders")
            .json("{\"order\": 42, \"state\": \"paid\"}")
            .key("order-42")
            .eventType("order.paid")
            .build());
        conn.commit();
        System.out.println("order 42 paid; outbox message " + id + " queued");
      } catch (InvalidMessageException e) {
        conn.rollback();
        System.err.println("refused: " + e.getMessage()); // the argument, the limit and the fix
        throw e;
      }
    }
  }
}
