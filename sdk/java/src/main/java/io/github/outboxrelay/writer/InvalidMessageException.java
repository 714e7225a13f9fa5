package io.github.outboxrelay.writer;

import java.sql.SQLException;

/**
 * A message the database refused (SQLSTATE 22023, 54000, 23505, 22P02, 22007, 22008, 22003 or
 * 54001): the text names the argument, the limit and the fix. The caller's transaction is
 * aborted; roll it back.
 */
public final class InvalidMessageException extends SQLException {
  private static final long serialVersionUID = 1L;

  InvalidMessageException(SQLException cause) {
    super(cause.getMessage(), cause.getSQLState(), cause.getErrorCode(), cause);
  }
}
