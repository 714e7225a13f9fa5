#include "outbox_relay/sink.h"

namespace outbox::relay {

const char* ToString(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::kDelivered:
      return "delivered";
    case OutcomeKind::kRetry:
      return "retry";
    case OutcomeKind::kPermanent:
      return "permanent";
    case OutcomeKind::kReturned:
      return "returned";
    case OutcomeKind::kFannedOut:
      return "fanned_out";
  }
  return "unknown";
}

}  // namespace outbox::relay
