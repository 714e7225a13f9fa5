#include "outbox_relay/verify.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace outbox::relay {

VerifyReport Reconcile(const std::vector<ArchivedMessage>& archived, const ReadBackResult& read) {
  VerifyReport report;
  report.archived = static_cast<std::int64_t>(archived.size());
  report.records = static_cast<std::int64_t>(read.records.size());
  for (const auto& stream : read.streams_read) report.streams[stream];
  report.missing = read.missing;

  std::unordered_map<std::int64_t, const ArchivedMessage*> by_id;
  by_id.reserve(archived.size());
  for (const auto& m : archived) by_id.emplace(m.id, &m);

  // Records in stream order; a stable sort keeps the order they were read in otherwise.
  std::vector<const ReadBackRecord*> records;
  records.reserve(read.records.size());
  for (const auto& r : read.records) records.push_back(&r);
  std::stable_sort(records.begin(), records.end(), [](const auto* a, const auto* b) {
    return a->stream != b->stream ? a->stream < b->stream : a->position < b->position;
  });

  // Occurrences by idempotency key: more than one is a duplicate. Only a first occurrence
  // takes part in the order check (a redelivery of an earlier message may come later).
  std::unordered_map<std::string, std::vector<const ReadBackRecord*>> occurrences;
  std::unordered_set<std::int64_t> found_ids;
  std::unordered_set<std::string> found_keys;
  // (stream, ordering key) -> the highest id first seen so far, and where.
  std::map<std::pair<std::string, std::string>, const ReadBackRecord*> highest;
  for (const ReadBackRecord* r : records) {
    auto& summary = report.streams[r->stream];
    ++summary.records;
    if (!r->outbox_id) {
      ++report.foreign;
      continue;
    }
    const std::string dedupe_key =
        r->idempotency_key.empty() ? "id:" + std::to_string(*r->outbox_id) : r->idempotency_key;
    auto& seen = occurrences[dedupe_key];
    seen.push_back(r);
    // The archived message this record is: the same id, and the same idempotency key when the
    // record carries one. An id alone is not enough: a database restored from a backup hands
    // ids out again, and a relay of another database may write the same topic (review: a
    // record from before a restore stood in for a message lost after it).
    const auto archived_it = by_id.find(*r->outbox_id);
    const ArchivedMessage* archived_as =
        archived_it != by_id.end() && (r->idempotency_key.empty() ||
                                       r->idempotency_key == archived_it->second->idempotency_key)
            ? archived_it->second
            : nullptr;
    if (archived_as) {
      found_ids.insert(*r->outbox_id);
    } else {
      ++report.not_archived;
    }
    // Found by its idempotency key alone only when its id is no archived message's (a
    // replayed dead letter is renumbered): an application may use a key again once its first
    // message is gone, and a record of the first must not stand for the second.
    if (archived_it == by_id.end()) found_keys.insert(r->idempotency_key);
    if (seen.size() > 1) {
      ++summary.duplicates;
      continue;
    }
    if (!archived_as || !archived_as->ordering_key) continue;
    const std::string& key = *archived_as->ordering_key;
    auto [it, inserted] = highest.try_emplace({r->stream, key}, r);
    if (inserted) continue;
    if (*r->outbox_id < *it->second->outbox_id) {
      ++summary.inversions;
      report.inversions.push_back({r->stream, key, *r->outbox_id, r->position,
                                   *it->second->outbox_id, it->second->position});
    } else {
      it->second = r;
    }
  }

  for (const auto& [key, seen] : occurrences) {
    if (seen.size() < 2) continue;
    VerifyReport::Duplicate d;
    d.idempotency_key = key;
    for (const auto* r : seen) {
      d.outbox_ids.push_back(*r->outbox_id);
      d.at.emplace_back(r->stream, r->position);
    }
    report.duplicates.push_back(std::move(d));
  }
  std::sort(report.duplicates.begin(), report.duplicates.end(),
            [](const auto& a, const auto& b) { return a.outbox_ids[0] < b.outbox_ids[0]; });

  for (const auto& m : archived) {
    // Found under its id, or under its idempotency key (a replayed dead letter is renumbered).
    if (found_ids.count(m.id) || found_keys.count(m.idempotency_key)) continue;
    report.gaps.push_back({m.id, m.idempotency_key, m.ordering_key});
  }
  return report;
}

}  // namespace outbox::relay
