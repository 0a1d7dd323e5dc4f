"""Five functions an assistant might be offered, and fifty requests that call for them (ten
each), the workload of the real-model tool-calling tests. The parameters are strict schemas, as
OpenAI's strict function calling and the agent SDKs write them (no additional properties);
strings carry a maxLength and amounts a multipleOf."""

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 80},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["query"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string", "maxLength": 60},
            "subject": {"type": "string", "maxLength": 60},
            "body": {"type": "string", "maxLength": 200}}, "required": ["to", "subject", "body"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 1000000, "multipleOf": 0.01},
            "source": {"enum": ["USD", "EUR", "GBP", "JPY"]},
            "target": {"enum": ["USD", "EUR", "GBP", "JPY"]}}, "required": ["amount", "source", "target"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "set_timer", "description": "Set a timer",
        "parameters": {"type": "object", "properties": {
            "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
            "label": {"type": "string", "maxLength": 30}}, "required": ["minutes"],
            "additionalProperties": False}}},
]

_PLACES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Mumbai", "Berlin", "Nairobi")
_TOPICS = ("black holes", "sourdough bread", "the Roman empire", "electric cars", "jazz", "volcanoes",
           "chess openings", "the moon landing", "coral reefs", "quantum computing")
REQUESTS = [
    *(f"What is the weather like in {place} right now?" for place in _PLACES),
    *(f"Find me some articles about {topic}." for topic in _TOPICS),
    *(f"Email {name}@example.com to say the meeting moved to {day}." for name, day in zip(
        ("ana", "ben", "chen", "dara", "eli", "fay", "gus", "hana", "ivan", "jo"),
        ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday") * 2)),
    *(f"How much is {amount} dollars in euros?" for amount in (5, 12, 40, 99, 150, 230, 500, 875, 1200, 3000)),
    *(f"Set a timer for {minutes} minutes for the {thing}." for minutes, thing in zip(
        (1, 3, 5, 8, 10, 15, 20, 25, 30, 45), ("eggs", "tea", "pasta", "rice", "laundry", "bread", "nap",
                                               "oven", "meeting", "run"))),
]
