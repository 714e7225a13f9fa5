// Publishes sample events through the SDK, each in the same transaction as a business write.
//
//   outbox-example-publish --database-url postgresql://... --orders 10 --invoices 5
#include <outbox/outbox.h>

#include <CLI/CLI.hpp>
#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"Publishes sample outbox messages through the SDK"};
  std::string url;
  int orders = 10, invoices = 5;
  std::string orders_destination = "orders", invoices_destination = "billing-hooks";
  app.add_option("--database-url", url, "PostgreSQL URL")->required();
  app.add_option("--orders", orders, "Order events (Kafka destination)");
  app.add_option("--invoices", invoices, "Invoice events (webhook destination)");
  app.add_option("--orders-destination", orders_destination);
  app.add_option("--invoices-destination", invoices_destination);
  CLI11_PARSE(app, argc, argv);

  try {
    pqxx::connection conn(url);
    {
      pqxx::work tx(conn);
      tx.exec(
          "CREATE TABLE IF NOT EXISTS example_orders (id int PRIMARY KEY, state text NOT NULL)");
      tx.commit();
    }
    for (int i = 1; i <= orders; ++i) {
      // The business write and its event commit together, or not at all.
      pqxx::work tx(conn);
      const int order_id = 1000 + (i - 1) / 2;  // two events per order: created, then paid
      const std::string state = (i % 2) ? "created" : "paid";
      tx.exec_params(
          "INSERT INTO example_orders (id, state) VALUES ($1, $2) "
          "ON CONFLICT (id) DO UPDATE SET state = excluded.state",
          order_id, state);
      outbox::Publish(tx, outbox::Message::To(orders_destination)
                              .Json("{\"order_id\": " + std::to_string(order_id) +
                                    ", \"state\": \"" + state + "\"}")
                              .Key("order-" + std::to_string(order_id))
                              .EventType("order." + state)
                              .Header("source", "outbox-example-publish")
                              .Build());
      tx.commit();
    }
    if (invoices > 0) {
      pqxx::work tx(conn);
      std::vector<outbox::OutboxMessage> batch;
      for (int i = 1; i <= invoices; ++i) {
        batch.push_back(outbox::Message::To(invoices_destination)
                            .Json("{\"invoice\": " + std::to_string(i) +
                                  ", \"amount_cents\": " + std::to_string(1999 * i) + "}")
                            .Key("customer-" + std::to_string(i % 2))
                            .EventType("invoice.issued")
                            .Build());
      }
      outbox::PublishMany(tx, batch);  // one round trip
      tx.commit();
    }
    std::cout << "published " << orders << " order event(s) and " << invoices
              << " invoice event(s)\n";
    return 0;
  } catch (const outbox::InvalidMessage& e) {
    std::cerr << "invalid message: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
}
