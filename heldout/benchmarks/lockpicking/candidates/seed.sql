CASE WHEN NOT REGEXP_LIKE(PROGRAM, '^[0-9]{6}$') THEN '0' ELSE CAST(
    IFF(SUBSTR(PROGRAM, 1, 1) IN ('1', '4', '7'), 1, 0)
  + IFF(SUBSTR(PROGRAM, 2, 1) IN ('2', '6', '8') AND SUBSTR(PROGRAM, 1, 1) <> '4', 1, 0)
  + IFF(SUBSTR(PROGRAM, 3, 1) IN ('0', '3', '9'), 1, 0)
  + IFF(SUBSTR(PROGRAM, 4, 1) IN ('1', '4', '7'), 1, 0)
  + IFF(SUBSTR(PROGRAM, 5, 1) IN ('0', '5', '8'), 1, 0)
  + IFF(SUBSTR(PROGRAM, 6, 1) IN ('2', '5', '9') AND SUBSTR(PROGRAM, 1, 1) <> '4', 1, 0)
  AS VARCHAR) END
